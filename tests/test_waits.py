"""Wait reasons are values; their text is rendered in one place."""

from __future__ import annotations

import math

from orchestrator.scheduling.waits import Wait, WaitKind, held, held_reason, render


def test_every_wait_kind_renders_one_nonempty_line() -> None:
    for kind in WaitKind:
        text = render(Wait(kind, gpu=0, for_job=7, need_mib=2048, text="x"))
        assert text and "\n" not in text, kind


def test_held_orders_pause_then_hold_then_draining() -> None:
    assert held("a", {"a"}, True, "disk full") == Wait(WaitKind.PAUSED, text="a")
    assert held("b", {"a"}, True, "disk full") == Wait(WaitKind.HOLD, text="disk full")
    assert held("b", {"a"}, True, None) == Wait(WaitKind.DRAINING)
    assert held("b", {"a"}, False, None) is None
    assert held_reason("a", {"a"}, False, None) == "suite a is paused"
    assert held_reason("b", set(), True, None) == "daemon is draining: nothing new starts"


def test_a_kept_card_is_named_after_the_reason() -> None:
    wait = Wait(WaitKind.MEMORY, gpu=1, free_mib=1024, need_mib=4096, headroom_mib=512, kept_gpu=2)
    assert render(wait) == "GPU 1: 1.0 GiB free, needs 4.0 GiB + 0.5 GiB headroom; GPU 2 kept free for it"
    starving = Wait(WaitKind.HELD_FOR_STARVING, gpu=0, for_job=3, ready_in_s=math.inf, waited_s=720.0)
    assert render(starving) == "held back: GPU 0 kept free for job 3 (waiting 12 min)"
