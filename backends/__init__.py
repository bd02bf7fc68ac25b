"""gdnzoo backends: one module per backend, installed as ``gdnzoo.backends``.

A backend's module is named after its public name (``fla-recurrent`` -> ``fla_recurrent.py``);
modules whose names start with ``_`` are shared plumbing, not backends.  Adding a backend is this
module plus one entry per operation it serves in ``registry.yaml`` (``operations.<op>.backends``);
the tests, ``gdnzoo list``, ``bench``, ``check`` and ``tune`` take the backend lists from there.
One module may serve several operations (decode, prefill, commit): it gets each one's call
records and tells them apart by ``call.op``.

The protocol every backend module follows (the registry calls nothing else):

``available(device) -> (bool, str)``
    Whether this backend can run calls on ``device`` ("cpu" or "cuda", one of the devices
    ``registry.yaml`` gives it) on this machine, and why not (a Triton backend on CPU needs the
    interpreter, pt-compiled's CPU code a C++ compiler).  Imports its optional packages lazily,
    inside the function; compiles nothing, launches nothing.

``supports(problem) -> (bool, str)``
    Whether it can serve this call's problem (head sizes, T, dtypes, GPU generation...), with
    the reason when it cannot.  ``problem`` is the operation's ``Problem`` (decode:
    :class:`gdnzoo.contract.Problem`; prefill: :class:`gdnzoo.prefill_contract.Problem`;
    commit: :class:`gdnzoo.commit_state.Problem`), which says the call's form too: ``pool``,
    ``verify``, ``pdl``, ``precomputed``, ``neg_eigval``, ``k_first`` (and prefill's
    ``initial`` and ``checkpoint_every``).  The registry has already checked what ``registry.yaml`` declares: devices,
    min compute capability, state dtypes, max T, head dims, and each of the operation's
    features (:mod:`gdnzoo.operation`: decode's ``pools``, ``verify``, ``pdl``,
    ``precomputed_gates``, ``neg_eigval``, ``k_first``; prefill's the same but ``verify``, and
    ``checkpoints``), each ``true`` or the string saying why this backend cannot serve it.

``run(call, *, config=None) -> None``
    Called only with a record of a validated call.  ``call`` is the operation's call record, a
    named tuple: the public function's arguments by name, resolved (``scale`` a float, ``out``
    and ``new_state`` tensors, ``new_state is state`` in place, ``null_slot`` an int, -1 for
    none, ``algo`` this backend), then ``problem``, and the parts a form needs:
    ``call.pool`` (:class:`gdnzoo.pool.Pool`: read and write slot indices; None for a dense
    state) and, for decode, ``call.verify`` (:class:`gdnzoo.verify.Verify`; None without
    verify).  Records: :class:`gdnzoo.contract.Call` (``call.positional()``: the twelve dense
    arguments ``q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state,
    use_qk_l2norm``), :class:`gdnzoo.prefill_contract.Call` (with ``cu_seqlens``,
    ``has_initial_state``, ``checkpoints``), :class:`gdnzoo.commit_state.Call`.  Writes every
    element of ``out`` and every state row the call names; must not modify any other input,
    synchronize the host, or (decode) allocate after the first call of a signature.

``bind(call, *, config=None) -> callable`` (optional)
    A launcher taking the record of any later call with this one's signature (shapes,
    strides, dtypes, devices, scale, l2norm flag, in-place-ness and form: what the dispatcher
    memoizes on), so per-signature work is done once; data pointers, and so their alignment,
    may differ between calls.  Without it the dispatcher calls ``run``.

A backend whose launch shape comes from the per-GPU launch tables (``tables/<gpu>.yaml``,
:mod:`gdnzoo.tables`) is *tunable*; ``gdnzoo tune --shapes`` searches every registered one
through four more names, with no code of its own for any backend:

``CONFIG: gdnzoo.tables.ConfigFields``
    Its launch fields by name, in order, with defaults: the ``config`` of its table rows.
``launch_config(problem, gpu_name) -> tuple``
    The row this GPU's tables give the call, fitted to its K and V (what ``run`` uses).
``candidates(problem) -> [config, ...]``
    The search's first stage for a measured cell (B, T, geometry, state dtype, mode).
``refine(ranked) -> [config, ...]``
    The second stage, from the first stage's configs ranked fastest first.

and ``run(call, config=...)`` (and ``bind``) launch an explicit config instead of the table's.

A module outside this package names its entry point in ``registry.yaml`` (``entry:
module:function``, a function taking the call record as ``run`` does).  A backend never imports
another backend.
"""
