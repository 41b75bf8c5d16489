"""state.db schema as versioned migrations. Never edit an applied migration: add a new one."""

from __future__ import annotations

import sqlite_utils
from sqlite_utils.migrations import Migrations

from orchestrator.store.initial_tables import INITIAL_TABLES_SQL

MIGRATIONS = Migrations("orch")


@MIGRATIONS()
def m001_initial(db: sqlite_utils.Database) -> None:
    db.executescript(INITIAL_TABLES_SQL)


@MIGRATIONS()
def m002_crash_loop(db: sqlite_utils.Database) -> None:
    # The suite's crash-loop guard, stored with each job like hang_timeout_s. Jobs queued before
    # the setting existed keep the values the guard had then: 3 failures within 30 s in 300 s.
    # crash_loop_failures = 0 switches the guard off for that job's suite.
    for statement in (
        "ALTER TABLE jobs ADD COLUMN crash_loop_failures INTEGER NOT NULL DEFAULT 3",
        "ALTER TABLE jobs ADD COLUMN crash_loop_within_s REAL NOT NULL DEFAULT 30",
        "ALTER TABLE jobs ADD COLUMN crash_loop_window_s REAL NOT NULL DEFAULT 300",
    ):
        db.execute(statement)


@MIGRATIONS()
def m003_prompt_lengths(db: sqlite_utils.Database) -> None:
    # The longest prompt (tokens, after truncation) a finished LoRA run reported, per model,
    # data set and max_seq_len: estimates of other configs on the same data use it.
    db.execute(  # one statement, not executescript: that would commit the migration's transaction
        """
        CREATE TABLE prompt_lengths (
            length_key TEXT PRIMARY KEY,
            longest_tokens INTEGER NOT NULL,
            updated_at REAL NOT NULL
        )
        """
    )


@MIGRATIONS()
def m004_host_steps(db: sqlite_utils.Database) -> None:
    # Host-side steps (fewer data workers, running alone) a job took after host-RAM OOMs, as a
    # JSON list; every later attempt keeps them on top of its ladder level.
    db.execute("ALTER TABLE jobs ADD COLUMN host_steps_json TEXT NOT NULL DEFAULT '[]'")


@MIGRATIONS()
def m005_suite_notify(db: sqlite_utils.Database) -> None:
    # A suite's `notify:` URLs, as of its latest submit, for the daemon's notifications.
    db.execute(  # one statement, not executescript: that would commit the migration's transaction
        """
        CREATE TABLE suite_notify (
            suite TEXT PRIMARY KEY,
            urls_json TEXT NOT NULL,
            updated_at REAL NOT NULL
        )
        """
    )


@MIGRATIONS()
def m006_gpu_samples(db: sqlite_utils.Database) -> None:
    # Each GPU's memory over time (ours vs foreign vs free) for the web page and the report.
    # The daemon writes a row per GPU every few seconds; the table is kept bounded by thinning
    # its older rows (store.gpu_samples), so a sweep of weeks stays small.
    db.execute(  # one statement, not executescript: that would commit the migration's transaction
        """
        CREATE TABLE gpu_samples (
            id INTEGER PRIMARY KEY,
            ts REAL NOT NULL,
            gpu_index INTEGER NOT NULL,
            gpu_uuid TEXT NOT NULL,
            total_mib INTEGER NOT NULL,
            used_mib INTEGER NOT NULL,
            orch_mib INTEGER NOT NULL,
            free_mib INTEGER NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX gpu_samples_gpu ON gpu_samples(gpu_uuid, id)")


@MIGRATIONS()
def m007_worker_output(db: sqlite_utils.Database) -> None:
    # What the daemon needs to drive and read a suite's own script, stored with each job as JSON:
    # `keys` (ladder knobs under the script's names), `progress_regex`, `result_regex`. And the
    # metrics parsed from an attempt's stdout when it wrote no result.json.
    db.execute("ALTER TABLE jobs ADD COLUMN worker_output_json TEXT NOT NULL DEFAULT '{}'")
    db.execute("ALTER TABLE attempts ADD COLUMN output_metrics_json TEXT")


@MIGRATIONS()
def m008_memory_learning(db: sqlite_utils.Database) -> None:
    # Shapes keyed by memory-relevant keys only; a suite's `memory_keys` (JSON list) and
    # `min_stack_gain` (NULL: stack up to the plan) are stored with each job. A shape row names
    # the suite and config that last taught it, so `orch memory forget --suite S` can find it.
    # Throughput: samples/s per GPU, shape and number of jobs on the card, learned while running.
    for statement in (
        "ALTER TABLE jobs ADD COLUMN memory_keys_json TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE jobs ADD COLUMN min_stack_gain REAL",
        "ALTER TABLE memory_shapes ADD COLUMN suite TEXT",
        "ALTER TABLE memory_shapes ADD COLUMN label TEXT",
        """
        CREATE TABLE throughput (
            gpu_uuid TEXT NOT NULL,
            shape_key TEXT NOT NULL,
            tenants INTEGER NOT NULL,       -- attempts on the card, this one included
            samples_per_s REAL NOT NULL,    -- running mean of one attempt's rate at that count
            samples INTEGER NOT NULL,
            suite TEXT,
            updated_at REAL NOT NULL,
            PRIMARY KEY (gpu_uuid, shape_key, tenants)
        )
        """,
    ):
        db.execute(statement)


@MIGRATIONS()
def m009_untrusted_files(db: sqlite_utils.Database) -> None:
    # The runs dir's free space as the daemon last read it ({path, free_mib, min_free_mib,
    # warn_free_mib, level}), so `orch status` can say the disk is full without a daemon call.
    db.execute("ALTER TABLE daemon ADD COLUMN disk_json TEXT")


@MIGRATIONS()
def m010_scale(db: sqlite_utils.Database) -> None:
    # Reads that must not scan a queue of 100,000 jobs: the head of the queue in order, a job's
    # attempts, succeeded attempts by end time (the run-time table is read incrementally), and
    # the latest retry events (a partial index over exactly the dashboard's filter).
    for statement in (
        "CREATE INDEX jobs_queue_order ON jobs(state, priority DESC, id)",
        "CREATE INDEX attempts_job ON attempts(job_id, n)",
        "CREATE INDEX attempts_ended ON attempts(outcome, ended_at)",
        "CREATE INDEX events_retry ON events(id) WHERE data_json LIKE '%\"retry\"%'",
    ):
        db.execute(statement)


@MIGRATIONS()
def m011_executors(db: sqlite_utils.Database) -> None:
    # Where an attempt runs: the executor that owns it ("tmux", "subprocess", "slurm") and its
    # opaque id there (a tmux window id, a Slurm job id); and, per job, the suite's `slurm:`
    # settings (validated at submit) and Slurm's word on a waiting attempt (pending reason).
    for statement in (
        "ALTER TABLE attempts ADD COLUMN executor TEXT",
        "ALTER TABLE attempts ADD COLUMN executor_id TEXT",
        "ALTER TABLE attempts ADD COLUMN executor_state TEXT",
        "ALTER TABLE jobs ADD COLUMN slurm_json TEXT NOT NULL DEFAULT '{}'",
    ):
        db.execute(statement)


@MIGRATIONS()
def m012_resources(db: sqlite_utils.Database) -> None:
    # Jobs bigger than one GPU and the host's other resources. A job asks for `gpus` cards (a
    # gang) and, when the suite says so, `cpus` cores. An attempt keeps all its cards (the first
    # stays in gpu_index/gpu_uuid), what its tree holds on each now and at its peak (JSON
    # {uuid: MiB}: the per-rank peaks; per process too, for ranks sharing a card), its rendezvous
    # port, and its host RAM (RSS of the process tree) and CPU use, now and at their peak. Host
    # RAM and CPU are learned per shape beside GPU memory. The daemon row keeps its last host
    # reading for `orch status`.
    for statement in (
        "ALTER TABLE jobs ADD COLUMN gpus INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE jobs ADD COLUMN cpus INTEGER",
        "ALTER TABLE attempts ADD COLUMN gpu_uuids_json TEXT",
        "ALTER TABLE attempts ADD COLUMN held_by_gpu_json TEXT",
        "ALTER TABLE attempts ADD COLUMN peak_by_gpu_json TEXT",
        "ALTER TABLE attempts ADD COLUMN peak_by_rank_json TEXT",  # {pid: {gpu: uuid, mib: peak}}
        "ALTER TABLE attempts ADD COLUMN port INTEGER",
        "ALTER TABLE attempts ADD COLUMN predicted_host_mib INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE attempts ADD COLUMN host_held_mib INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE attempts ADD COLUMN host_peak_mib INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE attempts ADD COLUMN cpu_peak_cores REAL",
        "ALTER TABLE daemon ADD COLUMN host_json TEXT",
        """
        CREATE TABLE host_shapes (
            shape_key TEXT PRIMARY KEY,
            host_peak_mib INTEGER NOT NULL,  -- largest RSS of one attempt's process tree
            cpu_peak_cores REAL,             -- largest CPU use of one attempt, in cores
            samples INTEGER NOT NULL,
            updated_at REAL NOT NULL
        )
        """,
    ):
        db.execute(statement)


@MIGRATIONS()
def m013_retry_count(db: sqlite_utils.Database) -> None:
    # A move down the ladder is a column, not a string searched for in the events' JSON: the
    # event that records it has retry = 1, written with it; the dashboard's retries panel reads
    # those through a partial index. Here the events so far are marked.
    for statement in (
        "ALTER TABLE events ADD COLUMN retry INTEGER NOT NULL DEFAULT 0",
        "UPDATE events SET retry = 1 WHERE data_json LIKE '%\"retry\"%' AND json_valid(data_json) "
        "AND json_type(data_json, '$.retry') = 'object'",
        "DROP INDEX IF EXISTS events_retry",
        "CREATE INDEX events_retries ON events(id) WHERE retry = 1",
    ):
        db.execute(statement)


@MIGRATIONS()
def m014_queue_changes(db: sqlite_utils.Database) -> None:
    # Which queued jobs changed, for a daemon that keeps the queue between passes: every insert,
    # update or delete of a row that is or was queued logs its id, whoever wrote it (a submit,
    # a cancel, a priority change, the daemon's own claims). The daemon reads the log from
    # where it last read and re-reads only those rows; AUTOINCREMENT keeps the numbering
    # rising after it deletes what it has read.
    for statement in (
        "CREATE TABLE queue_changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL)",
        "CREATE TRIGGER queue_changes_insert AFTER INSERT ON jobs WHEN NEW.state = 'queued' "
        "BEGIN INSERT INTO queue_changes (job_id) VALUES (NEW.id); END",
        "CREATE TRIGGER queue_changes_update AFTER UPDATE ON jobs "
        "WHEN OLD.state = 'queued' OR NEW.state = 'queued' "
        "BEGIN INSERT INTO queue_changes (job_id) VALUES (NEW.id); END",
        "CREATE TRIGGER queue_changes_delete AFTER DELETE ON jobs WHEN OLD.state = 'queued' "
        "BEGIN INSERT INTO queue_changes (job_id) VALUES (OLD.id); END",
    ):
        db.execute(statement)


@MIGRATIONS()
def m015_shape_teachers(db: sqlite_utils.Database) -> None:
    # Every suite that taught a shape, not only the last: `orch memory forget --suite S` must
    # find a shape that S taught and another suite taught after it.
    for statement in (
        "ALTER TABLE memory_shapes ADD COLUMN suites_json TEXT NOT NULL DEFAULT '[]'",
        "UPDATE memory_shapes SET suites_json = json_array(suite) WHERE suite IS NOT NULL",
    ):
        db.execute(statement)


@MIGRATIONS()
def m016_resume(db: sqlite_utils.Database) -> None:
    # An attempt after a death may continue from a checkpoint an earlier attempt of its job left
    # in its run dir: which attempt (its n) and which checkpoint (the folder's path).
    for statement in (
        "ALTER TABLE attempts ADD COLUMN resumed_from_attempt INTEGER",
        "ALTER TABLE attempts ADD COLUMN resumed_from_checkpoint TEXT",
    ):
        db.execute(statement)


@MIGRATIONS()
def m017_gpu_sample_holds(db: sqlite_utils.Database) -> None:
    # What each job held in a memory sample ({job id: MiB} on that GPU), so the web page's memory
    # chart can split "ours" per job. NULL in rows written before: those show ours as one band.
    db.execute("ALTER TABLE gpu_samples ADD COLUMN holds_json TEXT")


@MIGRATIONS()
def m018_memory_families(db: sqlite_utils.Database) -> None:
    # Where a learned shape sits in its memory family (jobs whose received configs differ only in
    # batch size and sequence length): the family's fit predicts members never run. Rows learned
    # before this have none: they are not part of any family's fit.
    for statement in (
        "ALTER TABLE memory_shapes ADD COLUMN family_key TEXT",
        "ALTER TABLE memory_shapes ADD COLUMN batch_size INTEGER",
        "ALTER TABLE memory_shapes ADD COLUMN tokens INTEGER",
    ):
        db.execute(statement)


@MIGRATIONS()
def m019_resume_boundaries(db: sqlite_utils.Database) -> None:
    # A resume never crosses a change of worker command (each attempt records the one it ran;
    # NULL in rows written before) nor an `orch retry --fresh` (attempts up to n are not resumed).
    for statement in (
        "ALTER TABLE attempts ADD COLUMN worker TEXT",
        "ALTER TABLE jobs ADD COLUMN fresh_after_attempt INTEGER NOT NULL DEFAULT 0",
    ):
        db.execute(statement)


@MIGRATIONS()
def m020_attempt_containment(db: sqlite_utils.Database) -> None:
    # `hunted`: processes of an attempt that had to be found and ended outside its process
    # group (setsid, double fork), in one line for `orch show`: how many, which, how found.
    # `token`: random per attempt, given to its wrapper and worker (ORCH_ATTEMPT_TOKEN); an
    # exit.json (and, from our workers, a result.json) without it is not this attempt's.
    db.execute("ALTER TABLE attempts ADD COLUMN hunted TEXT")
    db.execute("ALTER TABLE attempts ADD COLUMN token TEXT")


@MIGRATIONS()
def m021_one_executor_record(db: sqlite_utils.Database) -> None:
    # An attempt's executor and its id there are kept once: `executor`/`executor_id` take over
    # what `launcher`/`window_id` held for rows written before m011 (a tmux window id is the
    # tmux executor's id). Nothing reads or writes the old pair from here on. They stay in the
    # table: a daemon of an earlier orch, still running while a newer `orch` migrates its
    # state.db, writes them at every launch, and would lose its workers' records without them.
    db.execute("UPDATE attempts SET executor = launcher WHERE executor IS NULL AND launcher IS NOT NULL")
    db.execute("UPDATE attempts SET executor_id = window_id WHERE executor_id IS NULL AND window_id IS NOT NULL")


@MIGRATIONS()
def m022_disproved_figures(db: sqlite_utils.Database) -> None:
    # The most an OOM'd attempt of a shape was placed at: that figure is disproved, and no later
    # attempt of its jobs, at any ladder level, is predicted at or below it. NULL: no OOM placed.
    db.execute("ALTER TABLE memory_shapes ADD COLUMN disproved_mib INTEGER")


@MIGRATIONS()
def m022_start_level_notes(db: sqlite_utils.Database) -> None:
    # Why a job starts (or goes on) above the level its ladder would give it: the level it was
    # at is known not to fit any card it may use ("started at level 2: level 0 needs ≥ 24.6
    # GiB, the cards hold 24 GiB"). NULL: it runs where the ladder put it.
    db.execute("ALTER TABLE jobs ADD COLUMN level_note TEXT")


@MIGRATIONS()
def m026_metric_history(db: sqlite_utils.Database) -> None:
    # Every metric an attempt reported, at its step (progress.jsonl, parsed stdout, the final
    # metrics), for curves and their export. One value per (attempt, key, step), the last read
    # winning, so reading a file again after a daemon restart changes nothing; a key's history
    # beyond its cap is downsampled (store.history), keeping minima and maxima.
    db.execute(  # one statement, not executescript: that would commit the migration's transaction
        """
        CREATE TABLE metric_history (
            attempt_id INTEGER NOT NULL REFERENCES attempts(id) ON DELETE CASCADE,
            key TEXT NOT NULL,
            step REAL NOT NULL,
            value REAL NOT NULL,
            PRIMARY KEY (attempt_id, key, step)
        ) WITHOUT ROWID
        """
    )


@MIGRATIONS()
def m027_throughput_steps(db: sqlite_utils.Database) -> None:
    # A throughput reading counts the optimizer steps it rests on (a curve point needs enough of
    # them) and the lowest and highest rate folded into it (`orch memory` shows the spread).
    # Rows written before have 0 steps: they no longer shape a curve until measured again.
    for statement in (
        "ALTER TABLE throughput ADD COLUMN steps INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE throughput ADD COLUMN rate_min REAL",
        "ALTER TABLE throughput ADD COLUMN rate_max REAL",
    ):
        db.execute(statement)


@MIGRATIONS()
def m029_paused_configs(db: sqlite_utils.Database) -> None:
    # The crash-loop guard pauses the config whose attempts keep failing, not its whole suite:
    # the suite's healthy configs run on. The suite itself is paused (paused_suites) only once
    # every config with queued or running jobs is.
    db.execute(
        "CREATE TABLE paused_configs (suite TEXT NOT NULL, config_name TEXT NOT NULL, reason TEXT NOT NULL, "
        "paused_at REAL NOT NULL, PRIMARY KEY (suite, config_name))"
    )


@MIGRATIONS()
def m023_attempt_inexact_rungs(db: sqlite_utils.Database) -> None:
    # The rungs that change numerics an attempt went through (a JSON list of names, in ladder
    # order), decided when it starts; results mark every cell with such a run. NULL: recorded
    # before this column (results fall back to the level's recorded changes).
    db.execute("ALTER TABLE attempts ADD COLUMN inexact_rungs_json TEXT")


@MIGRATIONS()
def m027b_startup_times(db: sqlite_utils.Database) -> None:
    # Launch to the first training step (the shortest seen) and the GPU memory held before it
    # (the least seen), per suite and config (`suite/config`): what start-up overlap needs to
    # start a job ahead of the one it replaces.
    db.execute(
        "CREATE TABLE startups (key TEXT PRIMARY KEY, seconds REAL NOT NULL, held_mib INTEGER NOT NULL, "
        "samples INTEGER NOT NULL, updated_at REAL NOT NULL)"
    )


@MIGRATIONS()
def m026_not_science(db: sqlite_utils.Database) -> None:
    # A suite's `not_science:` keys as of the job's submit (a JSON list): config keys such as
    # output_dir or sim_seconds whose values never split results rows. '[]' for jobs before it.
    db.execute("ALTER TABLE jobs ADD COLUMN not_science_json TEXT NOT NULL DEFAULT '[]'")
