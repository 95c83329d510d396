"""An embedding table's gradient travels as the rows some worker touched, and the update is the dense one's."""

from __future__ import annotations

import pytest
import torch

from irbis.train.strategies.sync_sgd import SyncSGD
from irbis.train.strategy import DistributedOptimizer, FlatParams, WorkerContext, embedding_tables
from train_helpers import in_threads

VOCAB, DIM = 3000, 8


class BagOfWords(torch.nn.Module):
    """Token ids -> an embedding table (large enough to be row-sparse), mean over the row, a linear head."""

    def __init__(self, seed: int = 0, tie: bool = False, vocab: int = VOCAB) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(vocab, DIM, padding_idx=0)
        self.pos = torch.nn.Embedding(512, DIM)  # too small to be a table: its gradient stays dense
        self.head = torch.nn.Linear(DIM, 3)
        self.out = torch.nn.Linear(DIM, vocab, bias=False) if tie else None
        if tie:
            self.out.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = (self.emb(ids) + self.pos(torch.arange(ids.shape[1]))).mean(1)
        return self.head(h) if self.out is None else self.head(h) + self.out(h)[:, :3]


def _batches(rank: int, steps: int, vocab: int = VOCAB, width: int = 12) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randint(0, vocab, (4, width), generator=g), torch.randint(0, 3, (4,), generator=g))
            for _ in range(steps)]


def _train(world: int, sparse: bool, steps: int = 5, vocab: int = VOCAB, width: int = 12) -> list:
    """``world`` thread workers under sync with Adam; returns each worker's weights, bytes sent and whether
    its table is still set sparse after :meth:`FlatParams.release`."""
    models = [BagOfWords(seed=rank, vocab=vocab) for rank in range(world)]

    def work(rank: int, comm) -> tuple[torch.Tensor, int, bool]:
        model = models[rank]
        flat = FlatParams(list(model.parameters()), embedding_tables(model) if sparse else [])
        dopt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), SyncSGD(),
                                    WorkerContext(comm, rank, world), flat)
        for xb, yb in _batches(rank, steps, vocab, width):
            dopt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            dopt.step()
        flat.release()
        return flat.weights.clone(), comm.bytes_sent, model.emb.sparse

    return in_threads(world, work)


@pytest.mark.parametrize("world", [2, 3])
def test_rows_give_the_dense_all_reduce_s_weights_with_fewer_bytes(world):
    dense, rows = _train(world, sparse=False), _train(world, sparse=True)
    for (w_dense, sent_dense, _), (w_rows, sent_rows, still_sparse) in zip(dense, rows):
        torch.testing.assert_close(w_rows, w_dense, rtol=0, atol=1e-6)
        # each step's 48 ids per worker touch under 150 of 3000 rows; the first broadcast and each step's
        # union of rows (an int per table row) are the same on both sides
        assert sent_rows < 0.5 * sent_dense
        assert not still_sparse  # release gave the table its own setting back
    for w, _, _ in rows[1:]:
        assert torch.equal(w, rows[0][0])  # the replicas stay identical


def test_a_union_over_half_the_table_goes_dense_with_the_same_result():
    dense, rows = _train(2, sparse=False, vocab=1100, width=400), _train(2, sparse=True, vocab=1100, width=400)
    for (w_dense, sent_dense, _), (w_rows, sent_rows, _) in zip(dense, rows):
        torch.testing.assert_close(w_rows, w_dense, rtol=0, atol=1e-6)
        assert sent_rows >= sent_dense  # the whole buffer, plus the small union of rows


def test_a_tied_or_small_table_is_not_row_sparse():
    plain = BagOfWords()
    assert embedding_tables(plain) == [plain.emb]  # pos has 512 rows
    assert embedding_tables(BagOfWords(tie=True)) == []  # an output layer shares the weight: dense gradient


def test_touched_rows_are_the_batch_s_ids_and_the_gradient_is_the_dense_one():
    model, ref = BagOfWords(), BagOfWords()
    flat = FlatParams(list(model.parameters()), embedding_tables(model))
    xb, yb = _batches(0, 1)[0]
    flat.zero_grads()
    torch.nn.functional.cross_entropy(model(xb), yb).backward()
    assert model.emb.weight.grad.is_sparse
    flat.sync_grads_in()
    torch.nn.functional.cross_entropy(ref(xb), yb).backward()
    torch.testing.assert_close(model.emb.weight.grad, ref.emb.weight.grad)
    ids = set(xb.unique().tolist()) - {0}  # the padding row gets no gradient
    assert set(flat.touched[flat.tables[0][0]].tolist()) - {0} == ids
