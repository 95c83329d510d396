"""`irbis demo` on bad input: a one-line message and exit code 2, before any Spark session starts."""
from __future__ import annotations

import pytest

from irbis.cli import main


def _touch(root, rel):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\xff\xd8")


@pytest.mark.parametrize("files, csv, message", [
    ([], None, "no images"),
    (["a/b.jpg"], "path,label\na/b.jpg,animal\n", "missing column(s) ['camera', 'burst']"),
    (["animal/cam1/b1/0.jpg", "empty/cam1/b2/0.jpg"], None, "only one camera"),
    (["animal/cam1/b1/0.jpg", "animal/cam2/b2/0.jpg"], None, "only one class"),
    (["cat/cam1/b1/0.jpg", "empty/cam2/b2/0.jpg"], None, "name the class to detect with --positive"),
])
def test_bad_input_exits_2_with_a_message(tmp_path, capsys, files, csv, message):
    for rel in files:
        _touch(tmp_path, rel)
    if csv:
        (tmp_path / "metadata.csv").write_text(csv)
    code = main(["demo", "--images", str(tmp_path), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("irbis demo: ") and message in err and "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["--rungs", "TF-IDF+LR,BERT"], "unknown rung(s) ['BERT']"),
    (["--sample", "5"], "sample must be at least"),
    (["--folds", "1"], "folds must be at least 2"),
])
def test_bad_text_options_exit_2_with_a_message(tmp_path, capsys, argv, message):
    code = main(["demo", "--text", "--output", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("irbis demo: ") and message in err and "Traceback" not in err
