"""`orch web`: a Starlette app over state.db. Pages are server-rendered; a server-sent event
stream tells open pages when the state changed, and they fetch their fragment again (no
reload). Actions change state only by POST with the token printed at start."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from orchestrator.actions.suite_changes import retry_jobs
from orchestrator.actions.user_actions import Done, cancel_job, resume_suite, retry_job
from orchestrator.errors import JobNotFound, OrchError, UsageError
from orchestrator.executors.runs_tree import FileProblem, RunTreeError, open_regular_file
from orchestrator.lifecycle import JobState
from orchestrator.results.collect import RunReader
from orchestrator.rundir_files import RunDir
from orchestrator.store.db import Store
from orchestrator.store.web_queries import ChangeMarker, JobsFilter, change_marker
from orchestrator.web import pages, views
from orchestrator.web.assets import STATIC_FILES, static_text
from orchestrator.web.log_text import collapsed_chunks
from orchestrator.web.results_view import result_table

TOKEN_HEADER = "X-Orch-Token"
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]
KEEPALIVE_S = 15.0
LATEST_TIME_S = 253402300799.0  # 9999-12-31 23:59:59 UTC: the last second time.gmtime can show


def _job_id(request: Request) -> int:
    job_id = int(request.path_params["job_id"])
    if job_id >= 1 << 63:  # beyond SQLite's integers: no such job (not an overflow and a 500)
        raise JobNotFound(f"no job {job_id}")
    return job_id


def _float_param(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{name} must be a number of seconds since the epoch, not {raw[:40]!r}") from None
    if not math.isfinite(value) or abs(value) > LATEST_TIME_S:
        raise UsageError(f"{name} must be a time in seconds since the epoch, at most {LATEST_TIME_S:.0f} (year 9999)")
    return value


def _time_range(request: Request) -> tuple[float | None, float | None]:
    from_s, to_s = _float_param(request, "from"), _float_param(request, "to")
    if from_s is not None and to_s is not None and from_s > to_s:
        raise UsageError("from must not be later than to")
    return from_s, to_s


MAX_FORM_BYTES = 4096  # an action form holds the token and nothing else
LOG_CHUNK_BYTES = 1 << 16  # the whole log is streamed in pieces this large


def _int_param(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or len(raw) > 9:
        raise UsageError(f"{name} must be a whole number, not {raw[:40]!r}")
    return int(raw)
MAX_PICKED_JOBS = 200


def _text_param(request: Request, name: str) -> str | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if len(raw) > 200:
        raise UsageError(f"{name} is too long")
    return raw


def _jobs_filter(request: Request) -> JobsFilter:
    state = _text_param(request, "state")
    if state is not None and state not in {s.value for s in JobState}:
        raise UsageError(f"state must be one of {', '.join(s.value for s in JobState)}, not {state[:40]!r}")
    return JobsFilter(
        state,
        _text_param(request, "suite"),
        _text_param(request, "config"),
        _text_param(request, "data"),
    )


def _curve_params(request: Request) -> tuple[list[int], str | None, float, bool, bool]:
    ids = request.query_params.getlist("job")
    if len(ids) > MAX_PICKED_JOBS or not all(i.isdigit() and len(i) <= 18 for i in ids):
        raise UsageError(f"job must be job ids (at most {MAX_PICKED_JOBS})")
    raw = request.query_params.get("smooth") or "0"
    try:
        smooth = float(raw)
    except ValueError:
        raise UsageError(f"smooth must be a number from 0 to 0.99, not {raw[:40]!r}") from None
    if not 0.0 <= smooth < 1.0:  # NaN fails this too
        raise UsageError("smooth must be a number from 0 to 0.99")
    flag = {"1", "yes", "on", "true"}
    return ([int(i) for i in ids], _text_param(request, "config"), smooth,
            request.query_params.get("log", "") in flag, request.query_params.get("band", "") in flag)


def create_app(
    db_path: Path, token: str, *, loopback_only: bool = True, poll_s: float = 1.0, bound_host: str | None = None,
    plans_dir: Path | None = None,
) -> Starlette:
    """`plans_dir`: where a retry finds the suite files (as `orch retry --plans`); None: a
    retry runs the job as it was submitted."""
    cache = RunReader()

    def store() -> Store:
        return Store(db_path, create=False)

    def page(title: str, active: str, fragment_url: str, render: Callable[[Store], str]) -> HTMLResponse:
        with store() as s:
            body = render(s)
        return HTMLResponse(pages.layout(title, active, body, fragment_url=fragment_url, watch=pages.WATCH[active]))

    def fragment(render: Callable[[Store], str]) -> HTMLResponse:
        with store() as s:
            return HTMLResponse(render(s), headers={"Cache-Control": "no-store"})

    def overview_page(request: Request) -> Response:
        return page("Overview", "overview", "/fragment/overview", views.overview_view)

    def overview_fragment(request: Request) -> Response:
        return fragment(views.overview_view)

    def timeline_page(request: Request) -> Response:
        a, b = _time_range(request)
        query = "&".join(f"{k}={v!r}" for k, v in (("from", a), ("to", b)) if v is not None)
        url = "/fragment/timeline" + (f"?{query}" if query else "")
        return page("Timeline", "timeline", url, lambda s: views.timeline_view(s, a, b))

    def timeline_fragment(request: Request) -> Response:
        a, b = _time_range(request)
        return fragment(lambda s: views.timeline_view(s, a, b))

    def memory_page(request: Request) -> Response:
        return page("Memory", "memory", "/fragment/memory", views.memory_view)

    def memory_fragment(request: Request) -> Response:
        return fragment(views.memory_view)

    def jobs_page(request: Request) -> Response:
        f = _jobs_filter(request)
        return page("Jobs", "jobs", "/fragment/jobs" + (f"?{request.url.query}" if request.url.query else ""),
                    lambda s: views.jobs_view(s, f))

    def jobs_fragment(request: Request) -> Response:
        f = _jobs_filter(request)
        return fragment(lambda s: views.jobs_view(s, f))

    def curves_page(request: Request) -> Response:
        ids, config, smooth, log, band = _curve_params(request)
        by, metric = _text_param(request, "by"), _text_param(request, "metric")
        with store() as s:
            body = views.curves_view(s, ids, config, smooth=smooth, log=log, band=band, by=by,
                                     metric=metric)
        return HTMLResponse(pages.layout("Curves", "curves", body))

    def static(request: Request) -> Response:
        name = str(request.path_params["name"])
        if name not in STATIC_FILES:
            return PlainTextResponse(f"no static file {name[:60]!r}", status_code=404)
        return Response(static_text(name), media_type=STATIC_FILES[name], headers={"Cache-Control": "max-age=3600"})

    def job_page(request: Request) -> Response:
        job_id = _job_id(request)
        return page(f"Job {job_id}", "job", f"/fragment/job/{job_id}", lambda s: views.job_view(s, job_id))

    def job_fragment(request: Request) -> Response:
        job_id = _job_id(request)
        return fragment(lambda s: views.job_view(s, job_id))

    def job_log(request: Request) -> Response:
        """The attempt's whole stdout.log, streamed: each line at its last redraw, or with
        `raw=1` the bytes as the worker wrote them."""
        job_id = _job_id(request)
        n = _int_param(request, "attempt")
        with store() as s:
            run_dir = views.attempt_run_dir(s, job_id, n)
        try:  # user code writes in the run dir: no link followed, no FIFO read
            handle = os.fdopen(open_regular_file(Path(run_dir), RunDir.LOG), "rb")
        except FileNotFoundError:
            return PlainTextResponse(f"job {job_id}: no log yet", status_code=404)
        except (FileProblem, RunTreeError, OSError) as exc:
            return PlainTextResponse(f"job {job_id}: cannot show its log: {exc}", status_code=404)

        def chunks() -> Iterator[bytes]:
            with handle:
                while chunk := handle.read(LOG_CHUNK_BYTES):
                    yield chunk

        raw = request.query_params.get("raw", "") in {"1", "yes", "on", "true"}
        return StreamingResponse(
            chunks() if raw else collapsed_chunks(chunks()),
            media_type="text/plain; charset=utf-8",
            headers={"Cache-Control": "no-store"},
        )

    def results_page(request: Request) -> Response:
        return page("Results", "results", "/fragment/results", lambda s: views.results_view(s, cache, "/results.csv"))

    def results_fragment(request: Request) -> Response:
        return fragment(lambda s: views.results_view(s, cache, "/results.csv"))

    def trials_page(request: Request) -> Response:
        return page("Trials", "trials", "/fragment/trials", views.trials_view)

    def trials_fragment(request: Request) -> Response:
        return fragment(views.trials_view)

    def results_csv(request: Request) -> Response:
        with store() as s:
            csv = result_table(s, cache).csv
        return PlainTextResponse(csv, media_type="text/csv",
                                 headers={"Content-Disposition": 'attachment; filename="results.csv"'})

    async def stream(request: Request) -> Response:
        def marker() -> ChangeMarker:
            with store() as s:
                return change_marker(s)

        async def events() -> AsyncIterator[str]:
            last: ChangeMarker | None = None
            quiet_s = 0.0
            while not await request.is_disconnected():
                current = await run_in_threadpool(marker)
                if current != last:
                    last, quiet_s = current, 0.0
                    # each page redraws only for what it shows (data-watch on the page)
                    yield f"event: change\ndata: {json.dumps(asdict(current))}\n\n"
                elif quiet_s >= KEEPALIVE_S:
                    quiet_s = 0.0
                    yield ": keep-alive\n\n"
                await asyncio.sleep(poll_s)
                quiet_s += poll_s

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    def matches(sent: str) -> bool:
        return hmac.compare_digest(sent.encode(), token.encode())

    async def form_token(request: Request) -> str | None:
        """The token of an HTML form post (application/x-www-form-urlencoded), or None for an API call."""
        if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            return None
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                return ""
        return parse_qs(body.decode("utf-8", errors="replace")).get("token", [""])[0]

    async def action(
        request: Request, run: Callable[[Store], dict[str, object]], job_id: int | None = None
    ) -> Response:
        sent = await form_token(request)
        as_page = sent is not None

        def answer(heading: str, message: str, status: int, data: dict[str, object]) -> Response:
            if as_page:
                html = pages.layout(heading, "action", pages.action_page(heading, message, status, job_id))
                return HTMLResponse(html, status_code=status)
            return JSONResponse(data, status_code=status)

        if not matches(sent if sent is not None else request.headers.get(TOKEN_HEADER, "")):
            refusal = f"refused: send the token orch web printed in the {TOKEN_HEADER} header"
            return answer("Refused (403)", "refused: open the page through the address orch web printed (/?token=...), "
                          "so its buttons carry the token", 403, {"error": refusal})

        def in_store() -> dict[str, object]:
            with store() as s:  # opened in the worker thread that uses it (sqlite3 connections stay in theirs)
                return run(s)

        try:
            done = await run_in_threadpool(in_store)
        except JobNotFound as exc:
            return answer("Not found (404)", str(exc), 404, {"error": str(exc)})
        except OrchError as exc:
            return answer("Not done (409)", str(exc), 409, {"error": str(exc)})
        what = f"job {done['job']}" if "job" in done else f"suite {done.get('suite')}"
        if done["done"] == "skipped":  # e.g. cancel on a job that already ended: nothing changed
            return answer(
                f"{what}: nothing to do",
                f"{what} was left as it is: its state does not allow that.",
                200,
                done,
            )
        notes = done.get("notes")
        said = "".join(f" Note: {note}." for note in notes) if isinstance(notes, list) else ""
        return answer(f"{what}: {done['done']}", f"{what} is {done['done']}.{said}", 200, done)

    async def cancel(request: Request) -> Response:
        job_id = _job_id(request)
        return await action(request, lambda s: {"job": job_id, "done": cancel_job(s, job_id).value}, job_id)

    async def retry(request: Request) -> Response:
        job_id = _job_id(request)

        def run(s: Store) -> dict[str, object]:
            if plans_dir is None:
                return {"job": job_id, "done": retry_job(s, job_id).value}
            done = retry_jobs(s, [job_id], plans_dir)  # as `orch retry`: the suite file as it is now
            return {"job": job_id, "done": (Done.REQUEUED if done.requeued else Done.STOPPING).value,
                    "notes": done.notes}

        return await action(request, run, job_id)

    async def resume(request: Request) -> Response:
        suite = str(request.path_params["suite"])

        def run(s: Store) -> dict[str, object]:
            resume_suite(s, suite)
            return {"suite": suite, "done": "resumed"}

        return await action(request, run)

    async def on_not_found(request: Request, exc: Exception) -> Response:
        return PlainTextResponse(str(exc), status_code=404)

    async def on_bad_input(request: Request, exc: Exception) -> Response:
        return PlainTextResponse(str(exc), status_code=400)

    routes = [
        Route("/", overview_page), Route("/fragment/overview", overview_fragment),
        Route("/jobs", jobs_page), Route("/fragment/jobs", jobs_fragment), Route("/curves", curves_page),
        Route("/static/{name}", static),
        Route("/timeline", timeline_page), Route("/fragment/timeline", timeline_fragment),
        Route("/memory", memory_page), Route("/fragment/memory", memory_fragment),
        Route("/job/{job_id:int}", job_page), Route("/fragment/job/{job_id:int}", job_fragment),
        Route("/job/{job_id:int}/log", job_log),
        Route("/results", results_page), Route("/fragment/results", results_fragment),
        Route("/results.csv", results_csv), Route("/trials", trials_page), Route("/fragment/trials", trials_fragment),
        Route("/api/stream", stream),
        Route("/api/jobs/{job_id:int}/cancel", cancel, methods=["POST"]),
        Route("/api/jobs/{job_id:int}/retry", retry, methods=["POST"]),
        Route("/api/suites/{suite}/resume", resume, methods=["POST"]),
    ]
    warmed = threading.Event()

    def warm_up() -> None:
        # Read every succeeded run's result.json once, in the background at start: it is the
        # one slow part of a large sweep's Results page (about 0.3 s for 10,000 jobs).
        try:
            with store() as s:
                result_table(s, cache)
        except Exception:  # the page reads them itself then, and shows any error there
            pass
        finally:
            warmed.set()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        threading.Thread(target=warm_up, name="orch-web-warm-up", daemon=True).start()
        yield

    # the address it listens on (127.0.0.2 is loopback too) is a name the browser may use
    allowed_hosts = [*LOOPBACK_HOSTS, *([bound_host.strip("[]"), f"[{bound_host.strip('[]')}]"] if bound_host else [])]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)] if loopback_only else []
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={JobNotFound: on_not_found, UsageError: on_bad_input})
    app.state.results_warmed = warmed
    return app
