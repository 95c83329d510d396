"""The results files' header: the CPU's matrix instructions, which decide what reduced precision gains."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[3] / "benchmarks"))
from provenance import cpu_features  # noqa: E402


def test_cpu_features_name_the_matrix_instructions_the_cpu_reports(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : fpu sse2 avx2 avx512f avx512_vnni amx_tile amx_int8\n")
    assert cpu_features(str(info)) == " (AVX-512, VNNI, AMX-INT8)"
    info.write_text("flags : fpu sse2 avx2\n")
    assert cpu_features(str(info)) == ""
    assert cpu_features(str(tmp_path / "absent")) == ""
