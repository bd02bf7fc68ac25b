"""Speculative verify (gdnzoo/verify.py) through gdnzoo.decode for every backend that claims it
(registry ``verify: true``), against the float64 reference: out, every stored intermediate
state, the per-token slots, and the rest of the pool and intermediate storage bit-identical;
commit; verify -> commit -> verify against step-by-step decode; refusals; bad inputs."""
import itertools

import pytest
import torch

import gdnzoo
from gdnzoo.contract import Problem
from gdnzoo import registry
from gdnzoo.reference import reference_commit
from conftest import DEVICE
from gdnzoo.inputs import make_verify_case
from verify_cases import check_verify_call

SPECS = registry.load_registry().op().backends
CLAIMING = [n for n, s in SPECS.items() if s.verify is True]
REFUSING = [n for n, s in SPECS.items() if s.verify is not True]
SLOW = {"pt-compiled"} | ({"fla-recurrent"} if DEVICE == "cpu" else set())
TOKENS = (2, 3, 4, 8)


def _cases():
    combos = itertools.product(("states", "states+update", "slots"), TOKENS,
                               (torch.float32, torch.bfloat16),
                               (None, "neg", "null", "past", "extra"))
    out = []
    for i, (form, T, sd, pad) in enumerate(combos):
        if pad == "extra":             # the form's own padding
            pad = "acc" if form == "slots" else "row"
        geom = [(2, 4), (1, 4), (2, 2)][i % 3]
        out.append(dict(form=form.split("+")[0], update=form.endswith("update"), T=T, sd=sd,
                        pad=pad, H=geom[0], HV=geom[1], l2=bool(i % 2), seed=i,
                        idx=(torch.int32, torch.int64)[i // 2 % 2],
                        B=(3 if DEVICE == "cpu" else (1, 5, 33)[i % 3]),
                        rows="default" if i % 5 == 4 else "indexed"))
    return out


CASES = _cases()


def _id(c):
    return (f"{c['form']}{'+upd' if c['update'] else ''}-T{c['T']}-"
            f"{'fp32' if c['sd'] == torch.float32 else 'bf16'}-B{c['B']}-h{c['H']}x{c['HV']}-"
            f"{c['pad'] or 'nopad'}-{'i64' if c['idx'] == torch.int64 else 'i32'}"
            f"{'-l2' if c['l2'] else ''}{'-rows' if c['rows'] == 'default' else ''}")


def _usable(name, case):
    ok, why = registry.availability(name, DEVICE)
    if not ok:
        pytest.skip(f"{name} unavailable here: {why}")
    p, _ = gdnzoo.contract.validate(*case.x.args(), **case.kwargs())
    ok, why = registry.can_serve(name, p)
    if not ok:
        pytest.skip(f"{name} cannot serve this case: {why}")


def _case(c, dense=False, pad=None):
    return make_verify_case(c["form"], B=c["B"], T=c["T"], H=c["H"], HV=c["HV"],
                            state_dtype=c["sd"], device=DEVICE, seed=c["seed"],
                            pad=None if dense else c["pad"], update=c["update"], dense=dense,
                            index_dtype=c["idx"], rows=c["rows"])


@pytest.mark.parametrize("name", CLAIMING)
@pytest.mark.parametrize("c", CASES, ids=_id)
def test_verify_matrix(name, c):
    if name in SLOW and c["seed"] % 7:
        pytest.skip(f"{name}: every seventh case only (compiles per signature or runs in the "
                    f"Triton interpreter here)")
    case = _case(c)
    _usable(name, case)
    check_verify_call(name, case, c["l2"], f"{name} {_id(c)}")


@pytest.mark.parametrize("name", CLAIMING)
@pytest.mark.parametrize("update", (False, True))
@pytest.mark.parametrize("rows", ("default", "indexed"))
def test_verify_dense_state(name, update, rows):
    c = dict(CASES[0], form="states", update=update, rows=rows, T=3, seed=11 + update)
    case = _case(c, dense=True)
    _usable(name, case)
    check_verify_call(name, case, False, f"{name} dense state update={update} rows={rows}")


@pytest.mark.parametrize("name", CLAIMING)
@pytest.mark.parametrize("accepted", (1, 2, 4))
def test_verify_slots_each_accepted_count(name, accepted):
    case = make_verify_case("slots", B=3, T=4, device=DEVICE, seed=20 + accepted,
                            accepted=accepted, pad="col")
    _usable(name, case)
    check_verify_call(name, case, True, f"{name} slots accepted={accepted}")


@pytest.mark.parametrize("name", REFUSING)
def test_refusing_backends_say_why(name):
    case = make_verify_case("states", B=2, T=2, device=DEVICE, seed=3)
    before = case.buf.clone(), case.inter_buf.clone()
    with pytest.raises(ValueError, match="cannot serve"):
        gdnzoo.decode(*case.x.args(), algo=name, **case.kwargs())
    assert torch.equal(case.buf, before[0]) and torch.equal(case.inter_buf, before[1])


def test_automatic_choice_serves_verify():
    case = make_verify_case("slots", B=2, T=3, device=DEVICE, seed=5, pad="null")
    sel = gdnzoo.select(*case.x.args(), **case.kwargs())
    assert SPECS[sel.name].verify is True
    check_verify_call(None, case, False, f"automatic ({sel.name})")


# ---------------------------------------------------------------- commit

def _commit_case(seed, sd=torch.float32, B=5, T_max=4, rows=True, slots=True, device=DEVICE):
    case = make_verify_case("states", B=B, T=T_max - 1, state_dtype=sd, device=device,
                            seed=seed)
    gen = torch.Generator().manual_seed(seed)
    steps = torch.randint(0, T_max, (B,), generator=gen)
    steps[0] = -1                                   # rejected: skipped
    if B > 3:
        steps[3] = T_max + 2                        # past T_max: skipped
    null = 0
    idx = case.idx.clone()
    if B > 2:
        idx[2] = 0                                  # the null slot: skipped
    return dict(inter=case.inter, inter_idx=case.inter_idx if rows else None,
                steps=steps.to(device=device, dtype=torch.int32),
                state=case.x.state if slots else torch.randn_like(case.x.state[:B]),
                slots=idx if slots else None, null=null if slots else None, buf=case.buf)


@pytest.mark.parametrize("sd", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("rows", (True, False))
@pytest.mark.parametrize("slots", (True, False))
def test_commit_copies_exactly_the_accepted_step(sd, rows, slots):
    c = _commit_case(7, sd, rows=rows, slots=slots)
    want = c["state"].clone()
    reference_commit(c["inter"], c["inter_idx"], c["steps"], want, c["slots"], c["null"])
    buf0 = c["buf"].clone()
    inter0 = c["inter"].clone()
    gdnzoo.commit(c["inter"], c["inter_idx"], c["steps"], c["state"], c["slots"], c["null"])
    assert torch.equal(c["state"], want)                       # a copy: bit-exact
    assert torch.equal(c["inter"], inter0)
    if slots:                                                 # page gaps untouched too
        changed = (c["buf"] != buf0).nonzero().flatten()
        page = c["state"].stride(0)
        assert set((changed // page).tolist()) <= set(c["slots"].tolist())


def test_commit_skips_by_the_rules():
    c = _commit_case(8, B=5)
    before = c["state"].clone()
    gdnzoo.commit(c["inter"], c["inter_idx"], c["steps"], c["state"], c["slots"], c["null"])
    rows, steps, slots = c["inter_idx"].tolist(), c["steps"].tolist(), c["slots"].tolist()
    for n in range(5):
        s = slots[n]
        if n in (0, 2, 3):                                     # step -1, null slot, step >= T_max
            if s > 0:
                assert torch.equal(c["state"][s], before[s]), f"sequence {n} committed"
        else:
            assert torch.equal(c["state"][s], c["inter"][rows[n], steps[n]]), f"sequence {n}"


def test_commit_bad_inputs_name_the_argument():
    c = _commit_case(9)
    args = [c["inter"], c["inter_idx"], c["steps"], c["state"], c["slots"]]
    bad = [
        (2, c["steps"].float(), TypeError, "accepted_steps"),
        (2, c["steps"][:2], ValueError, "intermediate_indices.*accepted_steps"),
        (1, c["inter_idx"][:2], ValueError, "intermediate_indices"),
        (4, c["slots"].double(), TypeError, "state_indices"),
        (3, c["state"].to(torch.bfloat16), TypeError, "state"),
        (0, c["inter"].transpose(3, 4), ValueError, "intermediate_states"),
        (3, c["inter"][0], ValueError, "state"),                # overlaps intermediate_states
    ]
    before = c["buf"].clone()
    for i, value, exc, name in bad:
        a = list(args)
        a[i] = value
        with pytest.raises(exc, match=name):
            gdnzoo.commit(*a)
    with pytest.raises(ValueError, match="null_slot"):
        gdnzoo.commit(*args, null_slot=10 ** 6)
    assert torch.equal(c["buf"], before)


# ---------------------------------------------------------------- verify -> commit -> verify

@pytest.mark.parametrize("name", CLAIMING)
@pytest.mark.parametrize("sd", (torch.float32, torch.bfloat16))
def test_verify_commit_verify_equals_step_by_step(name, sd):
    """Two speculative rounds (verify T drafts without updating, commit the accepted step)
    leave the pool equal to decoding only the accepted tokens one by one."""
    if name in SLOW and sd == torch.bfloat16:
        pytest.skip(f"{name}: fp32 only here (slow)")
    B, T = 3, 4
    case = make_verify_case("states", B=B, T=T, state_dtype=sd, device=DEVICE, seed=31)
    _usable(name, case)
    x, pool, idx = case.x, case.x.state, case.idx
    step_pool = pool.clone()
    gen = torch.Generator().manual_seed(4)
    for rnd in range(2):
        y = make_verify_case("states", B=B, T=T, state_dtype=sd, device=DEVICE,
                             seed=40 + rnd).x
        gdnzoo.decode(y.q, y.k, y.v, pool, x.A_log, y.a, x.dt_bias, y.b, algo=name,
                      state_indices=idx, intermediate_states=case.inter,
                      intermediate_indices=case.inter_idx, update_state=False)
        steps = torch.randint(0, T, (B,), generator=gen).to(DEVICE)
        gdnzoo.commit(case.inter, case.inter_idx, steps, pool, idx)
        for n, st in enumerate(steps.tolist()):              # the accepted tokens only
            one = step_pool[idx[n]][None].clone()
            for t in range(st + 1):
                tok = slice(t, t + 1)
                gdnzoo.decode(y.q[n:n + 1, tok], y.k[n:n + 1, tok], y.v[n:n + 1, tok], one,
                              x.A_log, y.a[n:n + 1, tok], x.dt_bias, y.b[n:n + 1, tok],
                              algo="pt-reference")
            step_pool[idx[n]] = one[0]
    rows = idx.long()
    tol = 1e-5 if sd == torch.float32 else 1e-2
    err = (pool[rows].float() - step_pool[rows].float()).norm() / step_pool[rows].float().norm()
    assert err < tol, f"{name}: relative error {err:.2e}"


def test_host_index_check(monkeypatch):
    """GDNZOO_CHECK_INDICES=1 names the first bad verify index and touches nothing."""
    monkeypatch.setenv("GDNZOO_CHECK_INDICES", "1")

    def refused(case, match):
        before = case.buf.clone()
        with pytest.raises(ValueError, match=match):
            gdnzoo.decode(*case.x.args(), algo="pt-reference", **case.kwargs())
        assert torch.equal(case.buf, before)

    case = make_verify_case("slots", B=3, T=3, device=DEVICE, seed=1)
    case.accepted[1] = 4
    refused(case, r"num_accepted_tokens\[1\] = 4: expected a count in 1..T=3")
    case = make_verify_case("slots", B=3, T=3, device=DEVICE, seed=2, accepted=1)
    case.idx[2, 2] = case.idx[0, 1]
    refused(case, r"state_indices\[2, 2\] = .*also written by sequence 0")
    case = make_verify_case("slots", B=3, T=3, device=DEVICE, seed=3, accepted=2)
    case.idx[2, 0] = case.idx[0, 1]                    # sequence 0 reads (and writes) it
    refused(case, r"state_indices\[2, 0\] = .*also written by sequence 0")
    case = make_verify_case("states", B=3, T=2, device=DEVICE, seed=4)
    case.inter_idx[2] = case.inter_idx[0]
    refused(case, r"intermediate_indices\[2\] = .*also written by sequence 0")
    case = make_verify_case("states", B=3, T=2, device=DEVICE, seed=5)
    case.inter_idx[1] = 99
    refused(case, r"intermediate_indices\[1\] = 99: row out of range")
    case = make_verify_case("slots", B=3, T=3, device=DEVICE, seed=6, accepted=3, pad="col")
    check_verify_call("pt-reference", case, False, "a valid call passes the check")


def test_default_tables_choose_a_verify_backend():
    """Every default-table row's table_verify names backends that serve verify."""
    from gdnzoo import tables
    from gdnzoo.inputs import DTYPES
    for row in registry.load_registry().op().defaults:
        for sd, ranges in row.table_verify.items():
            p = Problem(B=4, T=4, H=4, HV=8, K=128, V=128, state_dtype=DTYPES[sd],
                        io_dtype=DTYPES["bf16"], device="cuda", pool=True, verify="states")
            assert tables.table_kind(row, p)[0] == "table_verify"
            for _, _, be in ranges:
                assert SPECS[be].verify is True, f"{row.gpu} {sd}: {be}"
