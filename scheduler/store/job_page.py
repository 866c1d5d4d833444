"""A page of jobs as JSON built by the database: the API's busiest read (the dashboard's job
list and `trainyard jobs` poll it).

The page is one statement that returns one row: the items as a JSON array, how many jobs
matched (up to one past the page) and the last id of the page. Built this way a page costs the
API process one fetch instead of a row, a type conversion and a validation per job, and the
database builds the text without the interpreter lock, so the event loop keeps serving other
requests meanwhile. Each item has the fields of JobOut (scheduler/store/models.py, served by the
API), computed as `api.routes.jobs.job_fields` computes them for one job; tests hold the two to
each other on both SQLite and PostgreSQL. The fields come from the model: one that is a Job
column of the same name is read and written as its type says (a time, a float, a document, a
flag).
"""

from __future__ import annotations

import functools
import string
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import (
    CTE,
    JSON,
    Boolean,
    ColumnElement,
    Float,
    Select,
    Subquery,
    Text,
    bindparam,
    case,
    cast,
    extract,
    func,
    literal,
    literal_column,
    select,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.orm import Session

from contract.allocation import AllocationState
from scheduler.store.models import (
    JOB_COMPUTED_FIELDS,
    JOB_FIELD_KINDS,
    Allocation,
    FieldKind,
    Job,
    JobOut,
    Prediction,
    User,
    utcnow,
)
from scheduler.store.states import JobState

NOW = bindparam("now", type_=Job.created_at.type)
LIMIT = bindparam("limit", type_=Job.id.type)

# Slots each user's live processes hold, for the queue's fair share.
_HELD = (
    select(Job.owner_id.label("owner_id"), func.sum(Allocation.slots).label("held"))
    .join(Job, Job.id == Allocation.job_id)
    # One bound value each: a list would be expanded into the statement's text again at every
    # execution.
    .where(
        Allocation.state.in_(
            [literal(state, Allocation.state.type) for state in AllocationState if state.active]
        )
    )
    .group_by(Job.owner_id)
    .subquery("held")
)
# Queued jobs with the keys of the placement order (scheduler/placement/plan.py order_queue):
# priority, the owner's slots held, the owner's turn (their n-th queued job), id.
_TURNS = (
    select(
        Job.id.label("job_id"),
        Job.priority.label("priority"),
        func.coalesce(_HELD.c.held, 0).label("held"),
        func.row_number()
        .over(partition_by=Job.owner_id, order_by=(Job.priority.desc(), Job.id))
        .label("turn"),
    )
    .outerjoin(_HELD, _HELD.c.owner_id == Job.owner_id)
    .where(Job.state == JobState.QUEUED)
    .subquery("turns")
)
# 1-based positions of the queued jobs, in the order the scheduler places them.
QUEUE_POSITIONS = select(
    _TURNS.c.job_id,
    func.row_number()
    .over(order_by=(_TURNS.c.priority.desc(), _TURNS.c.held, _TURNS.c.turn, _TURNS.c.job_id))
    .label("position"),
)
_POSITIONS = QUEUE_POSITIONS.subquery("positions")


def _queue_of(page_ids: Select[Any]) -> CTE:
    """The positions of the jobs `page_ids` selects, ranked among all queued jobs."""
    # The filter applies to the ranked rows (no database moves it below the window): the page
    # looks its up to `limit` jobs up in as many rows, not in every queued job (on SQLite a
    # scan of the queue per job of the page, 2/3 of the page's time with 500 queued jobs).
    return (
        select(_POSITIONS)
        .where(_POSITIONS.c.job_id.in_(page_ids))
        .cte("queue")
        # Computed once per page: unmarked, SQLite may run it again for every row of the page.
        .prefix_with("MATERIALIZED")
    )


# The computed fields of JobOut: the owner's name and the queue position join other tables;
# progress and the duration are computed from these columns.
_INPUTS = ("step", "train_steps", "started_at", "ended_at")
# The columns a page reads; the documents (spec, spec_yaml, effective_yaml) stay unread. A
# prediction run's progress ends at its largest shard's rows (predictions.largest_shard), read
# from its own row (null for a job of any other kind).
_LISTED = (
    *(
        getattr(Job, name)
        for name in dict.fromkeys([*JobOut.model_fields, *_INPUTS])
        if name not in JOB_COMPUTED_FIELDS
    ),
    User.name.label("owner"),
    ((Prediction.rows + Prediction.workers - 1) // Prediction.workers).label("largest_shard"),
)


class Dialect(Protocol):
    """The few expressions that SQLite and PostgreSQL spell differently."""

    # How a page row finds its queue position: a join (PostgreSQL hashes the queue), or a
    # subquery per row (SQLite indexes the queue for it; it would scan it per row in a join).
    queue_joined: bool

    def obj(self, *pairs: Any) -> ColumnElement[Any]: ...

    def iso(self, moment: ColumnElement[Any]) -> ColumnElement[Any]:
        """An ISO 8601 UTC time, as pydantic writes it: 2026-11-23T10:00:00.123456Z."""
        ...

    def seconds(self, start: ColumnElement[Any], end: ColumnElement[Any]) -> ColumnElement[Any]: ...

    def document(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        """A JSON column embedded as JSON; a missing or null document as {}."""
        ...

    def flag(self, column: ColumnElement[Any]) -> ColumnElement[Any]: ...

    def number(self, value: ColumnElement[Any]) -> ColumnElement[Any]:
        """A float written with every digit it needs to read back the same (or null)."""
        ...

    def array(self, item: ColumnElement[Any], order: ColumnElement[Any]) -> ColumnElement[Any]: ...


def _document_text(column: ColumnElement[Any]) -> ColumnElement[Any]:
    text = type_coerce(column, Text)
    return func.coalesce(func.nullif(text, "null"), "{}")


class SQLite(Dialect):
    queue_joined = False

    def obj(self, *pairs: Any) -> ColumnElement[Any]:
        return func.json_object(*pairs)

    def iso(self, moment: ColumnElement[Any]) -> ColumnElement[Any]:
        # Stored by SQLAlchemy as "2026-11-23 10:00:00.123456", always UTC.
        return func.replace(type_coerce(moment, Text), " ", "T").concat("Z")

    def seconds(self, start: ColumnElement[Any], end: ColumnElement[Any]) -> ColumnElement[Any]:
        return (func.julianday(end) - func.julianday(start)) * 86400.0

    def document(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        return func.json(_document_text(column))

    def flag(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        return func.json(case((column, "true"), else_="false"))

    def number(self, value: ColumnElement[Any]) -> ColumnElement[Any]:
        # json_object writes 15 significant digits; a double needs 17 to read back the same.
        return case((value.is_(None), None), else_=func.json(func.printf("%!.17g", value)))

    def array(self, item: ColumnElement[Any], order: ColumnElement[Any]) -> ColumnElement[Any]:
        # SQLite aggregates rows in the order the ordered page subquery yields them.
        return func.json_group_array(item)


class PostgreSQL(Dialect):
    queue_joined = True

    def obj(self, *pairs: Any) -> ColumnElement[Any]:
        return func.json_build_object(*pairs)

    def iso(self, moment: ColumnElement[Any]) -> ColumnElement[Any]:
        utc = func.timezone("UTC", moment)
        return func.to_char(utc, 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')

    def seconds(self, start: ColumnElement[Any], end: ColumnElement[Any]) -> ColumnElement[Any]:
        return extract("epoch", end - start)

    def document(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        return cast(_document_text(cast(column, Text)), JSON)

    def flag(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        return type_coerce(column, Boolean)

    def number(self, value: ColumnElement[Any]) -> ColumnElement[Any]:
        return value  # PostgreSQL writes the shortest exact form already

    def array(self, item: ColumnElement[Any], order: ColumnElement[Any]) -> ColumnElement[Any]:
        # As text: the driver would otherwise parse the array into Python objects.
        return cast(func.json_agg(aggregate_order_by(item, order)), Text)


DIALECTS: dict[str, Dialect] = {"sqlite": SQLite(), "postgresql": PostgreSQL()}


def _item(page: Subquery, sql: Dialect) -> ColumnElement[Any]:
    """One JobOut as a JSON object, from a row of the page."""
    c = page.c
    end = func.coalesce(c.largest_shard, c.train_steps)  # as predictions.progress_ends says
    progress = case(
        (end <= 0, 0.0),
        (c.step >= end, 1.0),
        else_=cast(c.step, Float) / end,
    )
    duration = case(
        (c.started_at.is_(None), None),
        else_=sql.seconds(c.started_at, func.coalesce(c.ended_at, NOW)),
    )
    computed: dict[str, Any] = {
        "owner": c.owner,
        "progress": progress,
        "duration_seconds": duration,
        "queue_position": c.queue_position,
    }
    # The keys are JobOut's field names, written into the statement as literals: a bound
    # parameter has no type PostgreSQL could infer inside json_build_object.
    pairs: list[Any] = []
    for key, kind in JOB_FIELD_KINDS.items():
        value = computed[key] if key in computed else c[key]
        pairs += (literal_column(f"'{key}'"), _as_json(sql, kind, value))
    return sql.obj(*pairs)


def _as_json(sql: Dialect, kind: FieldKind, value: ColumnElement[Any]) -> ColumnElement[Any]:
    """A field's value as its JSON form, by the kind of the field."""
    if kind == "time":
        return sql.iso(value)
    if kind == "float":
        return sql.number(value)
    if kind == "flag":
        return sql.flag(value)
    if kind == "document":
        return sql.document(value)
    return value


@dataclass(frozen=True)
class PageJson:
    items: str  # a JSON array of JobOut objects
    last_id: int | None  # the last job of the page
    more: bool  # whether a next page exists


@functools.cache
def _statement(dialect: str, *, admin: bool, states: bool, name: bool, cursor: bool) -> Select[Any]:
    """The page statement for one combination of filters, built once: building a statement
    costs more than running this one. Parameters: owner, states, pattern, before, limit, now."""
    sql = DIALECTS.get(dialect)
    if sql is None:
        raise NotImplementedError(f"listing jobs on {dialect}: the store supports {list(DIALECTS)}")
    matching = (
        select(*_LISTED)
        .join(User, User.id == Job.owner_id)
        .outerjoin(Prediction, Prediction.run_job_id == Job.id)
    )
    if not admin:
        matching = matching.where(Job.owner_id == bindparam("owner"))
    if states:
        matching = matching.where(Job.state.in_(bindparam("states", expanding=True)))
    if name:
        # Job names are ASCII: lower() folds them alike on every backend (SQLite's LIKE alone
        # ignores case, PostgreSQL's does not).
        matching = matching.where(func.lower(Job.name).like(bindparam("pattern"), escape="/"))
    if cursor:
        matching = matching.where(Job.id < bindparam("before"))
    newest = matching.order_by(Job.id.desc())
    # Paged first (the primary key read backwards), then given queue positions: the position
    # costs per job on the page, not per job in the store.
    paged = newest.limit(LIMIT).cte("paged")
    queue = _queue_of(select(paged.c.id))
    if sql.queue_joined:
        page = select(paged, queue.c.position.label("queue_position")).outerjoin(
            queue, queue.c.job_id == paged.c.id
        )
    else:
        # Asked only for a queued job: a page without one never computes the queue.
        position = select(queue.c.position).where(queue.c.job_id == paged.c.id)
        queued = case((paged.c.state == JobState.QUEUED, position.scalar_subquery()))
        page = select(paged, queued.label("queue_position"))
    rows = page.subquery("page")
    # Whether a next page exists: the same jobs, up to one past the page.
    matched = select(func.count()).select_from(
        newest.with_only_columns(Job.id).limit(LIMIT + 1).subquery("matched")
    )
    return select(
        type_coerce(sql.array(_item(rows, sql), rows.c.id.desc()), Text),
        matched.scalar_subquery(),
        func.min(rows.c.id),
    )


ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def like_pattern(part: str) -> str:
    """A LIKE pattern for lower-cased names that matches `part` anywhere, ignoring ASCII case,
    its wildcards taken literally."""
    escaped = part.translate(ASCII_LOWER).replace("/", "//").replace("%", "/%").replace("_", "/_")
    return f"%{escaped}%"


def page_json(
    session: Session,
    user: User,
    *,
    states: list[JobState] | None = None,
    name: str | None = None,
    limit: int = 50,
    before_id: int | None = None,
    now: datetime | None = None,
) -> PageJson:
    """Newest first, `limit` jobs that `user` may see (an admin every job) with ids below
    `before_id`, in `states`, with `name` anywhere in their name."""
    statement = _statement(
        session.get_bind().dialect.name,
        admin=user.is_admin,
        states=bool(states),
        name=bool(name),
        cursor=before_id is not None,
    )
    params: dict[str, Any] = {"now": now or utcnow(), "limit": limit}
    if not user.is_admin:
        params["owner"] = user.id
    if states:
        params["states"] = [str(state) for state in states]
    if name:
        params["pattern"] = like_pattern(name)
    if before_id is not None:
        params["before"] = before_id
    items, matched, last_id = session.connection().execute(statement, params).one()
    return PageJson(items=items or "[]", last_id=last_id, more=matched > limit)
