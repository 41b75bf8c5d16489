"""workers.lora.dropout: a keyed mask is the one the job draws alone, whatever shape its rows take
in a rung or a fused group (sliced by logits_to_keep, left-padded to a longer batch-mate, or a
slot of a stack's masks drawn into one tensor)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from workers.lora.dropout import DrawKey, KeyedDropout, stacked_masks  # noqa: E402

pytestmark = [pytest.mark.train]

P = 0.25


def dropout(seed: int, length: int) -> KeyedDropout:
    key = DrawKey(seed)
    key.at(step=3, micro_batch=1, sequence_length=length)
    return KeyedDropout(P, "model.layers.0.q_proj.default", key)


def own_mask(seed: int, rows: int = 2, length: int = 6, width: int = 5) -> torch.Tensor:
    return dropout(seed, length).keep_mask(torch.empty(rows, length, width))


def test_a_mask_is_drawn_over_the_jobs_own_positions_however_its_rows_are_cut_or_padded() -> None:
    mask = own_mask(1)
    assert set(mask.unique().tolist()) == {0.0, 1.0}  # the test can fail: a mask with both
    last = dropout(1, 6).keep_mask(torch.empty(2, 1, 5))  # logits_to_keep 1: the last position
    assert torch.equal(last, mask[:, -1:, :])
    padded = dropout(1, 6).keep_mask(torch.empty(2, 9, 5))  # left-padded to a batch-mate's 9
    assert torch.equal(padded[:, 3:, :], mask) and bool((padded[:, :3, :] == 1 - P).all())
    assert not torch.equal(own_mask(2), mask)


def test_a_stacks_masks_are_each_members_own_scaled_as_its_dropout_scales_them() -> None:
    members = [dropout(seed, length) for seed, length in ((1, 6), (2, 4), (3, 6))]
    rows = torch.ones(3, 2, 6, 5)
    masks = stacked_masks(list(members), rows)
    assert masks is not None
    for member, mask in zip(members, masks, strict=True):
        assert torch.equal(mask, member(torch.ones(2, 6, 5)))  # x * mask / (1 - p) with x = 1
    assert torch.equal(masks[1, :, :2, :], torch.ones(2, 2, 5))  # member 2's padding: kept, unscaled


def test_a_stack_of_other_dropouts_or_rates_has_no_joint_masks() -> None:
    rows = torch.ones(2, 2, 6, 5)
    other_rate = KeyedDropout(0.5, "m", DrawKey(2))
    assert stacked_masks([dropout(1, 6), other_rate], rows) is None
    assert stacked_masks([dropout(1, 6), torch.nn.Dropout(P)], rows) is None
    evaluating = dropout(1, 6).eval()
    assert stacked_masks([evaluating, evaluating], rows) is None
