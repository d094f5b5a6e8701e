"""Sparse tensors, both ways between holdpoint and torch (issue 38, item 3).

torch.save writes a sparse tensor as _rebuild_sparse_tensor(layout, parts): COO's
(indices, values, size, is_coalesced), and CSR/CSC/BSR/BSC's (compressed indices,
plain indices, values, size). torch.load builds it unchecked and validates it
only under torch.sparse.check_sparse_tensor_invariants, so a hostile index
reaches its kernels by default; holdpoint checks torch's invariants on every one.
This test checks that
  - holdpoint.load of torch.save's file gives what torch.load gives: the same
    layout, dtype, shape, index dtypes, coalesced flag, elements and class
    (Parameter with requires_grad), one object where the file references one twice;
  - torch.load(weights_only=True) of holdpoint.save's file gives the tensors saved,
    and the torch-1.13-compatible mode refuses them (1.13 has no such form);
  - with tensors="numpy", in holdpoint.inspect and in `holdpoint inspect --json`,
    a sparse tensor is its description with its parts;
  - hostile files, made with torch's own check_invariants=False, are refused, each
    with its code, where torch's default load takes them (and its opt-in check
    refuses them too).
"""

import json
import os
import sys
import tempfile
import warnings

import torch

import harness

sys.path.insert(0, os.path.join(harness.BUILD_DIR, "python"))
import holdpoint  # noqa: E402

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")


def tree():
    dense = torch.tensor([[0.0, 0.0, 3.0], [4.0, 0.0, 5.0]])
    coo = dense.to_sparse()
    parameter = torch.nn.Parameter(dense.to_sparse())
    return {
        "coo": coo,
        "uncoalesced": torch.sparse_coo_tensor([[1, 0, 1], [2, 0, 2]], [1.0, 2.0, 3.0], (2, 3)),
        "hybrid": torch.arange(12.0).reshape(3, 4).to_sparse(1),
        "empty": torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0), (5, 5)),
        "csr": dense.to_sparse_csr(),
        "csr32": torch.sparse_csr_tensor(torch.tensor([0, 1, 3], dtype=torch.int32),
                                         torch.tensor([2, 0, 2], dtype=torch.int32), torch.tensor([3.0, 4.0, 5.0]),
                                         (2, 3)),
        "csc": dense.to_sparse_csc(),
        "bsr": torch.eye(4, dtype=torch.float64).to_sparse_bsr((2, 2)),
        "bsc": torch.eye(4).to_sparse_bsc((2, 1)),
        "batched": torch.stack([dense, 2 * dense]).to_sparse_csr(),
        "complex": torch.tensor([[0, 1 + 2j], [3j, 0]]).to_sparse(),
        "parameter": parameter,
        "tied": parameter,  # the same Parameter again
        "dense": torch.arange(3.0),
    }


def parts_of(t):
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [t.crow_indices(), t.col_indices(), t.values()]
    return [t.ccol_indices(), t.row_indices(), t.values()]


def describe(t):
    out = (type(t).__name__, t.layout, t.dtype, tuple(t.shape), t.requires_grad)
    if t.layout == torch.sparse_coo:
        out += (t.is_coalesced(),)
    if t.layout != torch.strided:
        out += tuple(part.dtype for part in parts_of(t))
    return out


def same(report, label, got, want):
    report.check(list(got) == list(want), f"{label}: keys {list(got)}, want {list(want)}")
    for key in want:
        g, w = got.get(key), want[key]
        if not report.check(isinstance(g, torch.Tensor), f"{label}[{key!r}]: got {type(g)}"):
            continue
        report.check(describe(g) == describe(w), f"{label}[{key!r}]: {describe(g)}, want {describe(w)}")
        if w.layout != torch.strided and describe(g) == describe(w):
            equal = all(torch.equal(a, b) for a, b in zip(parts_of(g), parts_of(w)))
            report.check(equal, f"{label}[{key!r}]: the parts differ")
            report.check(torch.equal(g.detach().to_dense(), w.detach().to_dense()), f"{label}[{key!r}]: the elements differ")


def check_torch_to_holdpoint(report, tmp):
    path = os.path.join(tmp, "torch.pt")
    torch.save(tree(), path)
    want = torch.load(path, weights_only=True)
    got = holdpoint.load(path)
    same(report, "holdpoint.load(torch.save)", got, want)
    report.check(got["tied"] is got["parameter"], "a sparse Parameter referenced twice is one object")
    # Without torch's tensors and in inspect: a description with the parts.
    described = holdpoint.load(path, tensors="numpy")
    info = described["csr"]
    report.check(isinstance(info, holdpoint.TensorInfo) and info.get("layout") == "sparse_csr"
                 and info["shape"] == [2, 3] and len(info["parts"]) == 3
                 and list(info["parts"][1]) == [2, 0, 2],
                 f"tensors='numpy': a CSR tensor is its description: {info!r} {dict(info)}")
    inspected = holdpoint.inspect(path)
    node = inspected["tree"]["parameter"]
    report.check(node.get("layout") == "sparse_coo" and node.get("parameter") and node.get("requires_grad"),
                 f"holdpoint.inspect describes a sparse Parameter: {dict(node)}")
    result = harness.inspect(path)
    if report.check(result.returncode == 0, f"holdpoint inspect --json: {result.describe()}"):
        entries = {key["str"]: value for key, value in json.loads(result.stdout)["tree"]["dict"]}
        sparse = entries["coo"].get("sparse_tensor", {})
        report.check(sparse.get("layout") == "torch.sparse_coo" and sparse.get("shape") == [2, 3]
                     and sparse.get("coalesced") is True and len(sparse.get("parts", [])) == 2,
                     f"inspect --json: the COO tensor's node {entries['coo']}")


def check_holdpoint_to_torch(report, tmp):
    saved = tree()
    path = os.path.join(tmp, "mine.pt")
    holdpoint.save(path, saved)
    back = torch.load(path, weights_only=True)
    same(report, "torch.load(holdpoint.save)", back, saved)
    report.check(back["tied"] is back["parameter"], "holdpoint.save keeps the tied sparse Parameter one object")
    same(report, "holdpoint.load(holdpoint.save)", holdpoint.load(path), saved)
    # As torch.save, requires_grad stays only on a Parameter.
    grad = torch.sparse_coo_tensor([[0]], [1.0], (2,), requires_grad=True)
    holdpoint.save(os.path.join(tmp, "grad.pt"), {"g": grad})
    torch.save({"g": grad}, os.path.join(tmp, "grad_torch.pt"))
    report.check(holdpoint.load(os.path.join(tmp, "grad.pt"))["g"].requires_grad
                 == torch.load(os.path.join(tmp, "grad_torch.pt"), weights_only=True)["g"].requires_grad,
                 "requires_grad on a plain sparse tensor: as torch.save keeps it")
    harness.expect_raises(report, "a sparse tensor in the 1.13 mode", "write_value_unsupported",
                          lambda: holdpoint.save(os.path.join(tmp, "old.pt"), {"s": saved["coo"]},
                                                 torch_1_13_compatible=True), holdpoint.Error)


def hostile_tensors():
    """Sparse tensors torch builds unchecked (check_invariants=False) and saves."""
    unchecked = {"check_invariants": False}
    crow_csr = (lambda crow, col: torch.sparse_csr_tensor(torch.tensor(crow), torch.tensor(col),
                                                          torch.ones(len(col)), (2, 3), **unchecked))
    return {
        "a COO index past the size": (
            torch.sparse_coo_tensor([[0, 7]], [1.0, 2.0], (4,), **unchecked), "sparse_index_out_of_bounds"),
        "a negative COO index": (
            torch.sparse_coo_tensor([[0, -3]], [1.0, 2.0], (4,), **unchecked), "sparse_index_out_of_bounds"),
        "a CSR column past the size": (crow_csr([0, 1, 2], [0, 9]), "sparse_index_out_of_bounds"),
        "CSR compressed indices that stop short of nnz": (crow_csr([0, 1, 1], [0, 1]),
                                                          "sparse_compressed_indices_invalid"),
        "CSR compressed indices that overshoot nnz": (crow_csr([0, 3, 2], [0, 1]), "sparse_compressed_indices_invalid"),
        "a CSR row's columns out of order": (crow_csr([0, 2, 2], [2, 0]), "sparse_compressed_indices_invalid"),
    }


def check_hostile(report, tmp):
    for what, (tensor, code) in hostile_tensors().items():
        path = os.path.join(tmp, "hostile.pt")
        torch.save({"s": tensor}, path)
        harness.expect_raises(report, what, code, lambda: holdpoint.load(path), holdpoint.Error)
        # inspect scans without keeping the tensors; it reads the index records back to check them.
        harness.expect_raises(report, f"{what} (inspect)", code, lambda: holdpoint.inspect(path), holdpoint.Error)
        report.check(not harness.raises(lambda: torch.load(path, weights_only=True)),
                     f"{what}: torch's default safe load takes it (so holdpoint's check is the guard)")

        def checked_load():
            with torch.sparse.check_sparse_tensor_invariants(enable=True):
                torch.load(path, weights_only=True)
        report.check(harness.raises(checked_load), f"{what}: torch's opt-in invariant check refuses it too")


def main():
    report = harness.Report("sparse_tensors")
    with tempfile.TemporaryDirectory(prefix="holdpoint-sparse-") as tmp:
        check_torch_to_holdpoint(report, tmp)
        check_holdpoint_to_torch(report, tmp)
        check_hostile(report, tmp)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
