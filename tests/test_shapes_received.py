"""A shape is what the script receives: attempts passing identical memory-relevant settings
(after `--set` and the ladder) share one shape, whatever their config name or ladder level."""

from __future__ import annotations

from orchestrator.prediction.job_facts import JobShapeCache, job_levels, job_shape_key
from tests.rows_helpers import job_of

TRL = (
    "trl sft --per_device_train_batch_size {cfg.per_device_train_batch_size} "
    "--gradient_accumulation_steps {cfg.gradient_accumulation_steps} --seed {cfg.seed}"
)
KEYS = {
    "keys": {
        "batch_size": "per_device_train_batch_size",
        "gradient_accumulation_steps": "gradient_accumulation_steps",
    }
}


def _trl_job(  # type: ignore[no-untyped-def]
    job_id: int, config_name: str, batch: int, accumulation: int, seed: int = 1
):
    config = {"model_name_or_path": "llama-210m", "per_device_train_batch_size": batch,
              "gradient_accumulation_steps": accumulation, "seed": seed}
    return job_of(id=job_id, config_name=config_name, config_json=config, worker=TRL, worker_output_json=KEYS,
                  ladder_json=[{"halve_batch": True}], seed=seed)


def test_batch_256_at_level_1_and_batch_128_at_level_0_share_one_shape() -> None:
    cache = JobShapeCache()
    big, small = _trl_job(1, "b256", 256, 1), _trl_job(2, "b128", 128, 2, seed=7)
    big_levels, small_levels = job_levels(big, cache), job_levels(small, cache)
    assert big_levels[1].overrides == {"batch_size": 128, "gradient_accumulation_steps": 2}
    assert job_shape_key(big, big_levels[1]) == job_shape_key(small, small_levels[0])
    # the seed is not memory; the batch is
    assert job_shape_key(big, big_levels[0]) != job_shape_key(small, small_levels[0])
    assert job_shape_key(big, big_levels[2]) == job_shape_key(small, small_levels[1])


def test_batch_128_level_0_starts_at_the_batch_256_level_1_measurement() -> None:
    from orchestrator.prediction.job_prediction import predict
    from orchestrator.store.peak_source import SourceKind
    from orchestrator.store.rows import ShapeMemory

    cache = JobShapeCache()
    big, small = _trl_job(1, "b256", 256, 1), _trl_job(2, "b128", 128, 2)
    measured_at = job_shape_key(big, job_levels(big, cache)[1])
    shapes = {measured_at: ShapeMemory(9_318, None, 1)}
    mib, source = predict(shapes, small, job_levels(small, cache)[0], cache)
    assert source.kind is SourceKind.MEASURED and mib == round(9_318 * 1.05)


def test_two_commands_given_identical_configs_are_two_shapes() -> None:
    """`python small.py {config}` and `python big.py {config}` with one config file: their
    memory is not one figure (the command's digest is part of the shape and of the family)."""
    from orchestrator.prediction.job_facts import job_family_tag

    cache = JobShapeCache()
    config = {"model": "m", "batch_size": 8}
    small = job_of(id=1, config_json=config, worker="python small.py {config}")
    big = job_of(id=2, config_json=config, worker="python big.py {config}")
    again = job_of(id=3, config_json=config, worker="python small.py {config}", seed=9)
    level = job_levels(small, cache)[0]
    assert job_shape_key(small, level) != job_shape_key(big, level)
    assert job_shape_key(small, level) == job_shape_key(again, level)  # the same command, another seed
    assert job_family_tag(small, level) != job_family_tag(big, level)
