"""Text networks without Spark: the catalogue's encoder equals sentence-transformers on real reviews, on every
engine and in any row order; bad input gets a reason; a bad network is refused at load."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from irbis.demo.reviews import drug_reviews
from irbis.kernels.text_encoder import decode_texts, text_runner, text_tokens
from irbis.models.text_networks import TextModelError, text_card, text_source

MINILM = "all_minilm_l6_v2"


@pytest.fixture(scope="module")
def reviews():
    frame = drug_reviews()
    # the shortest, the longest (cut at 256 tokens) and a spread between, in the file's order
    by_length = frame["review"].str.len().sort_values().index
    picks = sorted(set(by_length[:4]) | set(by_length[-4:]) | set(by_length[::60]))
    return frame.loc[picks, "review"].tolist()


@pytest.fixture(scope="module")
def reference(reviews):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(text_source(MINILM)["folder"], device="cpu")
    return model.encode(reviews, batch_size=8, convert_to_numpy=True)


@pytest.mark.parametrize("engine", ["torch", "onnxruntime", "openvino"])
def test_embeddings_equal_sentence_transformers(reviews, reference, engine):
    batch = text_runner(text_source(MINILM), engine=engine).encode(reviews)
    assert batch.valid.all() and batch.values.shape == (len(reviews), 384)
    cosine = (batch.values * reference).sum(1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.9999
    assert batch.truncated >= 1  # the longest reviews pass 256 tokens, as sentence-transformers cuts them too


def test_int8_keeps_the_embeddings_of_other_reviews_close_to_fp32(reviews, reference):
    """NNCF's int8 on OpenVINO, calibrated on training reviews, scored on the held-out ones the fixture picks;
    ONNX Runtime's dynamic int8 needs no sample."""
    from irbis.kernels.calibration import write_texts

    calibration = write_texts(drug_reviews("train")["review"].tolist()[:48])
    for engine, options in (("openvino", {"calibration": calibration}), ("onnxruntime", {})):
        batch = text_runner(text_source(MINILM), engine=engine, precision="int8", **options).encode(reviews)
        cosine = (batch.values * reference).sum(1) / np.linalg.norm(batch.values, axis=1) / np.linalg.norm(
            reference, axis=1)
        assert cosine.mean() >= 0.99 and cosine.min() >= 0.95, (engine, cosine.mean(), cosine.min())


def test_int8_calibration_texts_default_to_prose_that_ships_with_python(tmp_path):
    from irbis.kernels.calibration import default_calibration_texts, text_calibration, write_texts

    default = default_calibration_texts()
    assert len(default) == 128 and min(len(t.split()) for t in default) >= 12
    key, texts = text_calibration("")
    assert texts == default and key == text_calibration("")[0]
    (tmp_path / "a.txt").write_text("one review")
    (tmp_path / "b.txt").write_text("another")
    assert text_calibration(str(tmp_path))[1] == ["one review", "another"]
    assert text_calibration(write_texts(["x", "y"]))[1] == ["x", "y"]
    assert text_calibration(write_texts(["x", "y"]))[0] != text_calibration(write_texts(["x", "z"]))[0]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no texts"):
        text_calibration(str(tmp_path / "empty"))


def test_row_order_and_batch_cuts_do_not_change_an_embedding(reviews):
    source = text_source(MINILM)
    whole = text_runner(source, engine="torch").encode(reviews).values
    order = np.random.default_rng(0).permutation(len(reviews))
    small = text_runner(source, engine="torch", token_budget=256, max_rows=3).encode([reviews[i] for i in order])
    assert small.stats.batches > len(reviews) // 3
    np.testing.assert_allclose(small.values, whole[order], atol=2e-5)


def test_nulls_empty_texts_and_huge_texts():
    runner = text_runner(text_source(MINILM), engine="torch")
    huge = "snow leopard " * 1_000_000  # 13 MB: capped before tokenizing
    batch = runner.encode(["", None, huge, "a short one"])
    assert batch.valid.tolist() == [True, False, True, True]
    assert batch.errors[1] == "null text" and batch.errors[0] is None
    assert batch.truncated == 1 and batch.values.shape == (3, 384)


def test_truncation_error_names_the_limit():
    runner = text_runner(text_source(MINILM), engine="torch", max_length=16, truncation="error")
    batch = runner.encode(["short", "word " * 40])
    assert batch.valid.tolist() == [True, False]
    assert "maxLength=16" in batch.errors[1]


def test_bytes_that_are_not_utf8_are_named_by_row():
    import pyarrow as pa

    from irbis.kernels.blocks import from_arrow

    texts, errors = decode_texts(from_arrow(pa.array([b"ok", b"\xff\xfe", None]), "body"), "body", "TextEmbedder")
    assert texts == ["ok", None, None]
    assert "row 1" in errors[1] and "'body'" in errors[1] and "UTF-8" in errors[1]
    with pytest.raises(TypeError, match="'body'.*int"):
        decode_texts(np.array([1, 2], dtype=object), "body", "TextEmbedder")


def test_max_length_keeps_the_closing_special_token():
    tokens = text_tokens(text_source(MINILM), 8)
    ids, cut = tokens.tokenize(["one two three four five six seven eight nine", "one two"])
    assert cut.tolist() == [True, False]
    assert len(ids[0]) == 8 and ids[0][0] == 101 and ids[0][-1] == 102  # [CLS] ... [SEP]


def test_catalogue_card_and_checksums(tmp_path, monkeypatch):
    card = text_card(MINILM)
    assert (card.task, card.max_length, card.pooling, card.normalize, card.dim) == ("embedding", 256, "mean", True, 384)
    import irbis.models.text_networks as text

    bad = text.TextCard(**{**card.to_dict(), "name": "tampered", "labels": (),
                           "sha256": {**card.sha256, "config.json": "0" * 64}})
    with pytest.raises(ValueError, match="checksum mismatch"):
        text.text_folder(bad)


def test_a_folder_without_safetensors_or_with_a_foreign_tokenizer_is_refused(tmp_path):
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[2]))
    from text_networks import tiny_text_network

    folder = tmp_path / "net"
    shutil.copytree(tiny_text_network("embedding"), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 1000}))
    with pytest.raises(TextModelError, match="30522 tokens but the network's embedding table has 1000"):
        text_runner(text_source(str(folder)), engine="torch")
    (folder / "model.safetensors").unlink()
    with pytest.raises(TextModelError, match="safetensors"):
        text_source(str(folder))
    with pytest.raises(TextModelError, match="neither a text network of the catalogue"):
        text_source(str(tmp_path / "nothing-here"))


def test_a_text_kernel_is_a_value_that_names_its_files_and_reads_them_where_they_land(tmp_path):
    import pickle

    from irbis.kernels.blocks import Tensor
    from irbis.kernels.text_encoder import TextKernel
    from irbis.spark.files import shipped_kernel
    from text_networks import tiny_text_network

    folder = tiny_text_network("embedding")
    options = {"engine": "torch", "max_length": 0}
    kernel = TextKernel(folder, text_source(folder), "text", head="embedding", outputs={"embedding": "emb"},
                        options=options, error_col="why", stage="TextEmbedder")
    assert kernel.files == (folder,)
    assert TextKernel(MINILM, text_source(MINILM), "text", head="tokens", outputs={"tokens": "t"},
                      options=options).files == ()  # found where it runs
    blocks = {"text": ["a cat", None, b"\xff"]}
    want = kernel(blocks)
    # a copy of the folder elsewhere (as shipped to an executor) gives the same rows
    moved = shutil.copytree(folder, tmp_path / "landed")
    back = pickle.loads(pickle.dumps(kernel)).relocated({folder: str(moved)})
    assert back.source["folder"] == str(moved) and back.files == (str(moved),)
    got = back(blocks)
    assert isinstance(got["emb"], Tensor) and got["emb"].valid.tolist() == [True, False, False]
    np.testing.assert_array_equal(got["emb"].values, want["emb"].values)
    assert got["why"][1] == "null text" and "not UTF-8" in got["why"][2]
    assert shipped_kernel(kernel) is kernel  # no Spark context: nothing to ship, the kernel itself runs
    assert kernel.measure(["a cat sat", None]).tolist()[1] == 2  # a null is an empty text: its special tokens
