"""gdnzoo backends: one module per backend, installed as ``gdnzoo.backends``.

A backend's module is named after its public name (``fla-recurrent`` -> ``fla_recurrent.py``);
modules whose names start with ``_`` are shared plumbing, not backends.  Adding a backend is this
module plus one entry in ``registry.yaml``; the tests, ``gdnzoo list``, ``bench`` and ``check``
take the backend list from the registry.

The protocol every backend module follows (the registry calls nothing else):

``available() -> (bool, str)``
    Whether this backend can run on this machine at all, and why not.  Imports its optional
    packages lazily, inside the function; compiles nothing, launches nothing.

``supports(problem: gdnzoo.contract.Problem) -> (bool, str)``
    Whether it can serve these particular inputs (head sizes, T, state dtype, GPU generation...),
    with the reason when it cannot.  The registry has already checked what ``registry.yaml``
    declares (device, min compute capability, state dtypes, max T, head dims).

``run(q, k, v, state, A_log, a, dt_bias, b, scale, out, new_state, use_qk_l2norm) -> None``
    Called only after :func:`gdnzoo.contract.validate` accepted the inputs.  ``scale`` is a
    resolved float, ``out`` an allocated [B,T,HV,V] tensor, ``new_state`` an allocated
    [B,HV,V,K] tensor or ``state`` itself (in place).  Writes every element of both.  Must not
    modify any other input, synchronize the host, or allocate after the first call for a shape.

``bind(same arguments as run) -> callable`` (optional)
    A launcher with ``run``'s signature, valid for every later call whose shapes, strides,
    dtypes, devices, scale, l2norm flag and in-place-ness equal these (what
    :func:`gdnzoo.decode` memoizes on), so per-signature work is done once.  Data pointers
    (and so their alignment) may differ between calls.

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

and ``run(..., config=None)`` (and ``bind``) launch an explicit config instead of the table's.

A backend never imports another backend.
"""
