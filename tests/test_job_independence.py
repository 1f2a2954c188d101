"""A token's score does not depend on the job it is in (issue 25 §1).

The scoring plan (:mod:`rmfast.scoring.plan`) decides nothing from a job's size: ``compile=auto`` is the
eager layer for ten ids and for a whole vocabulary alike, and every batch of a token scan is padded
to one row count, so each GEMM has the shape it has in the whole scan. Without the padding a
7-row batch of SmolLM2 rounds differently from a 1,024-row one (MKL/oneDNN pick kernels by M):
this test fails then, in fp32 and bf16.
"""

import numpy as np
import pytest

from rmfast.scoring.pipeline import scan

PROMPT = "What, in one word, is the greatest thing ever?"


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def smol_rm(request):
    from rmfast.loading.loader import load

    try:
        return load("smollm2-135m-instruct", dtype=request.param, device="cpu", random_head_seed=0)
    except Exception as e:
        pytest.skip(f"embedded SmolLM2 unavailable: {e}")


def test_a_subset_scores_like_the_whole_job_bit_for_bit(smol_rm):
    """Default settings: the same ids scored inside a 3,000-id job and alone, in small subsets."""
    m, tok = smol_rm.model, smol_rm.tokenizer
    whole = scan(m, tok, PROMPT, token_ids="0:3000", progress=False)
    assert whole.manifest["compiled"] is False and whole.manifest["fixed_shapes"] is True
    for ids in ([2999], [5, 17, 400, 1024, 1025, 2048, 2999], list(range(1000, 1300))):
        sub = scan(m, tok, PROMPT, token_ids=np.array(ids), progress=False)
        assert sub.manifest["batch_size"] == whole.manifest["batch_size"]
        np.testing.assert_array_equal(sub.scores, whole.scores[ids])


def test_without_padding_the_rounding_would_differ(smol_rm):
    """The guard above can fail: the same ids in a batch of their own, unpadded, differ in the last bits."""
    from rmfast.scoring.plan import plan_scoring
    from rmfast.template import build_template

    tmpl = build_template(smol_rm.tokenizer, PROMPT)
    plan = plan_scoring(smol_rm.model, tmpl, head="score")
    ids = np.arange(1000, 1000 + plan.rows_per_batch(1))[:, None]
    full = plan.score(ids)
    plan.fixed_shapes = False
    alone = np.concatenate([plan.score(ids[i:i + 7], 7) for i in range(0, 70, 7)])
    assert not np.array_equal(alone, full[:70])
