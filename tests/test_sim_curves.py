"""The sim worker's curves: its test accuracy follows the setting as its val curve does."""

from __future__ import annotations

from workers.sim_curves import final_test, final_val


def test_the_test_accuracy_follows_the_learning_rate_where_val_does() -> None:
    best = {"learning_rate": 1e-3, "sim_best_lr": 1e-3, "seed": 1}
    far = {**best, "learning_rate": 1e-1}
    assert final_test(best, 80, 0.5)["accuracy"] > final_test(far, 80, 0.5)["accuracy"] + 0.2
    assert final_test(best, 80, 0.5)["accuracy"] < final_val(best, 80, 0.5)["accuracy"]  # a little below val
    seeds = {final_test({**best, "seed": seed}, 80, 0.5)["accuracy"] for seed in range(3)}
    assert len(seeds) == 3  # apart per seed
    assert final_test({"learning_rate": 1e-3}, 80, 0.73) == {"accuracy": 0.73}  # no curve: as before


def test_the_val_loss_falls_as_the_accuracy_climbs_and_ranks_settings_alike() -> None:
    from workers.sim_curves import val_curve

    best = {"learning_rate": 1e-3, "sim_best_lr": 1e-3, "seed": 1}
    far = {**best, "learning_rate": 3e-2}
    early, late = val_curve(best, 5), val_curve(best, 80)
    assert late["val_loss"] < early["val_loss"] and late["val_accuracy"] > early["val_accuracy"]
    assert val_curve(best, 80)["val_loss"] < val_curve(far, 80)["val_loss"]  # the better setting, lower
    assert final_val(best, 80, 0.5) == {"accuracy": late["val_accuracy"], "loss": late["val_loss"]}
    assert val_curve({"learning_rate": 1e-3}, 80) == {}  # no curve: as before
