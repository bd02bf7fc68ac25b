"""``lab.chain_ab`` with the solo form's dynamic shared memory raised to 136 KB (one CTA an SM, as
the split chain's lo tiles would need), the same arguments.  From the repository root:

    python lab/notebook/h200/chain_split_prec_2026-12-01/one_cta.py --solo \\
        --edits lab/notebook/h200/chain_split_prec_2026-12-01/split_edits.py \\
        --variants solosplit+tp3 --cells 4/8:1x8192,16/32:8x1024
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from gdnzoo.backends import _cuda_chunk_chain as chain        # noqa: E402
from lab import chain_ab                                       # noqa: E402

chain.SOLO_SMEM = 136 * 1024
chain_ab.main()
