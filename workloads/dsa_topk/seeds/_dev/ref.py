"""Reference, inputs and checker for dsa_topk (scratch)."""
import torch

PB = 8448
_CACHES = {}


def make_inputs(B, P, num_pages=11923, seed=0, device="cpu", lens=None):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, 64, 128, generator=g) * 2).to(torch.float8_e4m3fn)
    if num_pages not in _CACHES:
        g0 = torch.Generator().manual_seed(12345)
        kv = (torch.randn(num_pages, 64, 128, generator=g0) * 2).to(torch.float8_e4m3fn)
        sc = torch.rand(num_pages, 64, generator=g0) * 0.1 + 0.01
        cache = torch.empty(num_pages, PB, dtype=torch.uint8)
        cache[:, :8192] = kv.view(torch.uint8).reshape(num_pages, 8192)
        cache[:, 8192:] = sc.contiguous().view(torch.uint8).reshape(num_pages, 256)
        _CACHES[num_pages] = cache.view(torch.int8).reshape(num_pages, 64, 1, 132)
    cache = _CACHES[num_pages]
    w = torch.randn(B, 64, generator=g)
    if lens is None:
        lens = torch.randint(0, P * 64 + 1, (B,), generator=g)
        edge = [0, 1, P * 64, 2048, 2049, 63, 64, 65, P * 64 - 1]
        for i in range(min(B, len(edge))):
            lens[i] = min(edge[i], P * 64)
    sl = torch.as_tensor(lens, dtype=torch.int32)
    bt = torch.stack([torch.randperm(num_pages, generator=g)[:P] for _ in range(B)]).int()
    out = torch.full((B, 2048), 123456789, dtype=torch.int32)
    t = [q, cache, w, sl, bt, out]
    return [x.to(device) for x in t]


def true_scores(q, cache, w, sl, bt):
    """list of (global ids [L], scores [L]) per row, float64."""
    q, cache, w, sl, bt = [x.cpu() for x in (q, cache, w, sl, bt)]
    n = cache.shape[0]
    raw = cache.reshape(n, PB).view(torch.uint8)
    res = []
    for b in range(q.shape[0]):
        L = int(sl[b])
        pos = torch.arange(L)
        pages = bt[b, pos // 64].long()
        off = pos % 64
        kb = raw[pages][torch.arange(L), :8192].reshape(L, 64, 128)  # wrong shape guard
        kb = raw[pages, :8192].reshape(L, 64, 128)[torch.arange(L), off]
        k = kb.contiguous().view(torch.float8_e4m3fn).double()
        s = raw[pages, 8192:].contiguous().view(torch.float32).reshape(L, 64)[torch.arange(L), off]
        qq = q[b].double()
        dots = (qq @ (k * s.double()[:, None]).T).relu()  # [64, L]
        sc = (w[b].double()[:, None] * dots).sum(0)
        res.append((pages * 64 + off, sc))
    return res


def check(out, q, cache, w, sl, bt, tag=""):
    return check_with_truth(out, true_scores(q, cache, w, sl, bt), tag)


def check_with_truth(out, truth, tag=""):
    out = out.cpu()
    bad = 0
    for b, (ids, sc) in enumerate(truth):
        L = len(ids)
        k = min(2048, L)
        row = out[b].long()
        if not (row[k:] == -1).all():
            print(tag, "row", b, "padding wrong", row[k:][:8]); bad += 1; continue
        sel = row[:k]
        if len(set(sel.tolist())) != k:
            print(tag, "row", b, "duplicates/garbage"); bad += 1; continue
        lookup = {int(g): float(s) for g, s in zip(ids.tolist(), sc.tolist())}
        if any(int(x) not in lookup for x in sel):
            print(tag, "row", b, "unreachable id", L); bad += 1; continue
        got = torch.tensor(sorted((lookup[int(x)] for x in sel), reverse=True))
        exp = torch.sort(sc, descending=True).values[:k]
        diff = (got - exp).abs()
        okv = (diff <= 0.01) | (diff <= 0.01 * exp.abs())
        if not okv.all():
            print(tag, "row", b, "score mismatch", int((~okv).sum()), float(diff.max())); bad += 1
    return bad
