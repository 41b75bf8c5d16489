"""The tables of state.db as its first migration (m001_initial in store.migrations) created them.
Later migrations change them; this text never changes (an applied migration is never edited)."""

INITIAL_TABLES_SQL = """
        CREATE TABLE jobs (
            id INTEGER PRIMARY KEY,
            identity TEXT NOT NULL,
            suite TEXT NOT NULL,
            config_name TEXT NOT NULL,
            config_path TEXT NOT NULL,
            config_json TEXT NOT NULL,      -- suite config + seed/data + --set overrides
            seed INTEGER NOT NULL,
            data TEXT NOT NULL,
            overrides_json TEXT NOT NULL,
            env_json TEXT NOT NULL,         -- suite env + env.* overrides
            worker TEXT NOT NULL,
            declared_mib INTEGER NOT NULL,  -- the suite's mem_gib
            allowed_gpus_json TEXT,         -- --gpus restriction, NULL = any
            priority INTEGER NOT NULL DEFAULT 0,
            state TEXT NOT NULL,
            level INTEGER NOT NULL DEFAULT 0,   -- ladder level the next attempt runs at
            attempt_count INTEGER NOT NULL DEFAULT 0,
            max_attempts INTEGER NOT NULL,
            one_token INTEGER NOT NULL DEFAULT 0,
            ladder_json TEXT,               -- suite ladder override, NULL = default
            hang_timeout_s REAL NOT NULL,
            reason TEXT,                    -- why it failed / was cancelled
            wait_reason TEXT,               -- why a queued job is not running yet
            queued_at REAL NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE INDEX jobs_identity ON jobs(identity);
        CREATE INDEX jobs_state ON jobs(state, priority, id);
        CREATE INDEX jobs_suite ON jobs(suite);

        CREATE TABLE attempts (
            id INTEGER PRIMARY KEY,
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            n INTEGER NOT NULL,
            gpu_index INTEGER NOT NULL,
            gpu_uuid TEXT NOT NULL,
            level INTEGER NOT NULL,
            level_step TEXT,
            changes_json TEXT NOT NULL DEFAULT '{}',    -- what this level changed
            overrides_json TEXT NOT NULL DEFAULT '{}',  -- all ladder overrides in config.yaml
            run_alone INTEGER NOT NULL DEFAULT 0,
            run_dir TEXT NOT NULL,
            predicted_peak_mib INTEGER NOT NULL,
            prediction_source TEXT NOT NULL,
            reserved_mib INTEGER NOT NULL,
            held_mib INTEGER NOT NULL DEFAULT 0,
            peak_mib INTEGER NOT NULL DEFAULT 0,
            reached_peak INTEGER NOT NULL DEFAULT 0,
            launcher TEXT,
            window_id TEXT,
            pid INTEGER,
            pgid INTEGER,
            proc_create_time REAL,
            started_at REAL NOT NULL,
            last_progress_at REAL,
            progress_json TEXT,
            ended_at REAL,
            outcome TEXT,                   -- NULL while live
            exit_code INTEGER,
            signal INTEGER,
            reason TEXT,
            kill_requested TEXT,            -- 'cancel' | 'retry' | 'hung' when someone asked to stop it
            UNIQUE(job_id, n)
        );
        CREATE INDEX attempts_live ON attempts(outcome, gpu_index);

        CREATE TABLE events (
            id INTEGER PRIMARY KEY,
            ts REAL NOT NULL,
            job_id INTEGER,
            attempt_id INTEGER,
            kind TEXT NOT NULL,
            from_state TEXT,
            to_state TEXT,
            message TEXT NOT NULL,
            data_json TEXT
        );
        CREATE INDEX events_job ON events(job_id, id);

        CREATE TABLE gpu_plan (
            gpu_index INTEGER PRIMARY KEY,  -- -1 holds the default for GPUs not named
            slots INTEGER NOT NULL,
            updated_at REAL NOT NULL
        );

        CREATE TABLE memory_shapes (
            shape_key TEXT PRIMARY KEY,
            peak_mib INTEGER,
            oom_floor_mib INTEGER,
            samples INTEGER NOT NULL DEFAULT 0,
            updated_at REAL NOT NULL
        );

        CREATE TABLE daemon (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            pid INTEGER,
            proc_create_time REAL,
            started_at REAL,
            heartbeat_at REAL,
            draining INTEGER NOT NULL DEFAULT 0,
            stop_requested INTEGER NOT NULL DEFAULT 0,
            gpus_json TEXT                 -- last GPU snapshots, for `orch status` without NVML
        );

        CREATE TABLE paused_suites (
            suite TEXT PRIMARY KEY,
            reason TEXT NOT NULL,
            paused_at REAL NOT NULL
        );
        """
