"""`orch memory` and `orch plan` show user text as every other output does (wording.one_line): a
line break, an ESC or a right-to-left override in a model path, a suite, a config or a task is
shown escaped, never split a row, reach the terminal or reorder a line; `--json` keeps it raw."""

from __future__ import annotations

import json

from orchestrator.prediction.memory import shape_key
from orchestrator.store.rows import FamilyTag, ShapeMemory

# a model path as a suite's `model:` may hold it (a foreign worker takes any text): a
# right-to-left override, a colour escape, a C1 next-line and a line break
MODEL = "tiny\u202eamall\x1b[31mRED\x85x\nnl"
SHOWN = "tiny\\u202eamall\\x1b[31mRED\\x85x\\nnl"
HIDDEN = ("\u202e", "\x1b", "\x85")


def _learn(db_path, label_suffix: str = "") -> dict[int, str]:  # type: ignore[no-untyped-def]
    """Two learned shapes of one memory family (as the daemon records a run), and one shape
    nothing named (its key's head is the name `orch memory` shows)."""
    from orchestrator.store.attempts import write_shape
    from orchestrator.store.db import Store
    from orchestrator.store.learning import label_shape

    keys = {batch: shape_key(f"{batch:016x}", MODEL, "glue_rte") for batch in (32, 64)}
    with Store(db_path) as store:
        for batch, key in keys.items():
            write_shape(store, key, ShapeMemory((7 + batch // 32) * 1024, None, 1))
            label_shape(store, key, "esc", f"b{batch}{label_suffix} L0 glue_rte",
                        FamilyTag(f"0b925b90dea97539|{MODEL}", batch, None, "glue_rte"))
        write_shape(store, shape_key("ffff", MODEL, "glue_rte"), ShapeMemory(None, 4_000, 0))
    return keys


def test_orch_memory_shows_a_model_path_escaped_in_its_rows_keys_and_families(  # type: ignore[no-untyped-def]
    orch_inproc, db_path
) -> None:
    keys = _learn(db_path)
    for args in (("memory",), ("memory", "--keys")):
        result = orch_inproc(*args)
        assert result.rc == 0, result.stderr
        assert not any(c in result.stdout for c in HIDDEN), (args, result.stdout)
        lines = result.stdout.splitlines()
        # a header, three shapes, a blank line, the families' title, the family and its two points:
        # no row split
        assert len(lines) == 9, (args, lines)
        assert lines[4] == "" and lines[5].startswith("memory families") and lines[6] == (
            f"  esc: b32, b64 ({SHOWN}): fit 7.0 GiB + 32.0 MiB per sample, error 0%, margin 5%"), lines
        assert f"ffff|{SHOWN}|glue_rte" in lines[1], lines  # a shape nothing named: its key's head
    keyed = orch_inproc("memory", "--keys").stdout.splitlines()
    for batch, line in zip((32, 64), keyed[2:4], strict=True):
        assert line.startswith(f"esc/b{batch} L0 glue_rte ") and line.endswith(f"{batch:016x}|{SHOWN}|glue_rte")
    # --json keeps what was stored
    shown = json.loads(orch_inproc("memory", "--json").stdout)
    assert {s["shape"] for s in shown["shapes"]} == {*keys.values(), shape_key("ffff", MODEL, "glue_rte")}
    (family,) = shown["families"]
    assert family["model"] == MODEL and family["family"] == f"0b925b90dea97539|{MODEL}"


def test_orch_memory_shows_a_stored_name_escaped(orch_inproc, db_path) -> None:  # type: ignore[no-untyped-def]
    # names are checked at submit, but `orch memory` reads whatever the database holds
    _learn(db_path, label_suffix="\u202e\n")
    result = orch_inproc("memory")
    assert result.rc == 0 and not any(c in result.stdout for c in (*HIDDEN, "\u202e"))
    assert "esc/b32\\u202e\\n L0 glue_rte " in result.stdout
    assert "esc: b32\\u202e\\n, b64\\u202e\\n (" in result.stdout
    assert len(result.stdout.splitlines()) == 9
    labels = {s["label"] for s in json.loads(orch_inproc("memory", "--json").stdout)["shapes"]}
    assert "b32\u202e\n L0 glue_rte" in labels


def test_orch_memory_forget_and_orch_plan_errors_show_user_text_escaped(  # type: ignore[no-untyped-def]
    orch_inproc, db_path, tmp_path
) -> None:
    _learn(db_path)
    odd_db = str(tmp_path / "x\u202ey\n.db")
    for args in (("memory", "forget", "a\u202eb"), ("memory", "forget", "a\x85b"),
                 ("memory", "forget", "--suite", "s\u202e"), ("memory", "--db", odd_db),
                 ("plan", "set", "2,\u202e1"), ("plan", "set", "2\x1b[31m"), ("plan", "set", "1\n2"),
                 ("plan", "set", "2", "--gpus", "0\u202e"), ("plan", "show", "--db", odd_db)):
        result = orch_inproc(*args)
        assert result.rc == 2 and result.stdout == "", args
        assert len(result.stderr.splitlines()) == 1 and not any(c in result.stderr for c in HIDDEN), (args, result)
        assert "\\u202e" in result.stderr or "\\x" in result.stderr or "\\n" in result.stderr, (args, result)
    # `orch plan` prints GPU indexes and counts only (no user text); its JSON is numbers
    assert orch_inproc("plan", "show").stdout == "GPU plan: at most 1 job(s) at a time on every GPU\n"
