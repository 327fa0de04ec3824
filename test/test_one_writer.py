"""State with one writer: each state record changes only in the module that defines it, through the methods its
docstring names (docs/architecture.md, "Who writes what").

Every module of `python/vradix` is read with `ast`. A write is an assignment to a record's field (`x.f = ...`,
`x.f += ...`, `setattr(x, "f", ...)`), an item assignment or deletion in it (`x.f[k] = ...`, `del x.f[k]`) or a
mutating call on it (`x.f.pop(...)`), where `x` is plausibly that record: a parameter annotated with its class, a
name assigned from the record's constructor, from a call to a function annotated to return it or from a record field
holding it (`state.freed`), or, when nothing says otherwise, a name the code base uses for it by convention (`state`,
`st`, `inv`, ...). A write to a record outside its defining module fails the check. `vradix.testing` gets no
exemption: it writes no record."""
import ast
import dataclasses
import importlib
import pathlib

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / "python" / "vradix"

#: owner module -> the records it defines (each record's fields are written only there)
RECORDS = {
    "vradix.engine": ("Engine", "PrefixHits"),
    "vradix.core.state": ("Bump", "GuardRecord", "DedupRecord", "FreedCounters",
                          "StorageCounters", "BucketedUpdate", "TreelessState"),
    "vradix.core.crossing": ("CrossingRequests",),
    "vradix.core.lora": ("LoraRecord",),
    "vradix.core.sessions": ("SessionSlots",),
    "vradix.request": ("ReqState",),
    "vradix.core.deferred_reclaim": ("DeferredReclaim",),
    "vradix.core.staleness": ("StalenessRecord",),
}
#: dataclasses of the state modules that are not checked, and why
NOT_RECORDS = {
    "EpochIdentity": "frozen: it cannot be written at all",
}
#: the names the code base gives a record where nothing else says what a name holds
CONVENTIONAL = {"state": "Engine", "st": "ReqState", "inv": "Bump", "q": "DeferredReclaim",
                "rec": "StalenessRecord", "bucketed": "BucketedUpdate", "treeless": "TreelessState"}
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "remove", "add",
            "discard", "move_to_end", "sort", "reverse"}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules():
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def records():
    """record name -> (owner module, {field: the record the field holds, or None})."""
    out = {}
    for owner, names in RECORDS.items():
        mod = importlib.import_module(owner)
        for name in names:
            out[name] = (owner, {f.name: f.type for f in dataclasses.fields(getattr(mod, name))})
    known = set(out)
    return {name: (owner, {f: record_named(t, known) for f, t in fields.items()})
            for name, (owner, fields) in out.items()}


def record_named(annotation, known) -> "str | None":
    """The record an annotation (a node or its source text) names, if any."""
    if annotation is None:
        return None
    node = ast.parse(annotation, mode="eval") if isinstance(annotation, str) else annotation
    for n in ast.walk(node):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            name = record_named(n.value, known)
        if name in known:
            return name
    return None


def returns(trees, known) -> dict:
    """function name -> the record it is annotated to return (over every module: calls are matched by name)."""
    out = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                rec = record_named(node.returns, known)
                if rec is not None:
                    out[node.name] = rec
    return out


class Checker:
    """The record writes of one module's source that happen outside their record's owner."""

    def __init__(self, recs: dict, returned: dict):
        self.recs, self.returned = recs, returned

    def violations(self, source: str, module: str) -> list:
        tree = ast.parse(source)
        bad = []
        for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
            names = self.names_of(scope)
            for node in own_nodes(scope):
                for target, field, line in writes(node):
                    rec = self.type_of(target, names)
                    if rec is not None and field in self.recs[rec][1] and self.recs[rec][0] != module:
                        bad.append(f"{module}:{line}: {ast.unparse(target)}.{field} ({rec}, owned by "
                                   f"{self.recs[rec][0]})")
        return bad

    def names_of(self, scope) -> dict:
        """name -> record (None: known not to be one) for a function's parameters and assignments."""
        names = {}
        if not isinstance(scope, ast.Module):
            a = scope.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                if arg.annotation is not None:
                    names[arg.arg] = record_named(arg.annotation, self.recs)
        for node in own_nodes(scope):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    for e, v in pairs(t, node.value):
                        if isinstance(e, ast.Name):
                            names[e.id] = self.type_of(v, names) if v is not None else None
        return names

    def type_of(self, expr, names) -> "str | None":
        if isinstance(expr, ast.Name):
            return names[expr.id] if expr.id in names else CONVENTIONAL.get(expr.id)
        if isinstance(expr, ast.Attribute):
            holder = self.type_of(expr.value, names)
            return self.recs[holder][1].get(expr.attr) if holder is not None else None
        if isinstance(expr, ast.Call):
            f = expr.func
            called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            return called if called in self.recs else self.returned.get(called)
        return None


def own_nodes(scope):
    """The nodes of `scope`, not those of the functions it defines (each is its own scope)."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def pairs(target, value):
    """(name target, the value assigned to it, None when unknown) for a possibly unpacking assignment."""
    if isinstance(target, (ast.Tuple, ast.List)):
        values = value.elts if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts) \
            else [None] * len(target.elts)
        for t, v in zip(target.elts, values):
            yield from pairs(t, v)
    else:
        yield target, value


def writes(node):
    """(the written object's expression, field, line) for each field write `node` makes."""
    targets = []
    if isinstance(node, (ast.Assign, ast.Delete)):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    for t in targets:
        for e, _ in pairs(t, None):
            if isinstance(e, ast.Subscript):
                e = e.value
            if isinstance(e, ast.Attribute):
                yield e.value, e.attr, node.lineno
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Name) and f.id == "setattr" and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant):
            yield node.args[0], node.args[1].value, node.lineno
        elif isinstance(f, ast.Attribute) and f.attr in MUTATORS and isinstance(f.value, ast.Attribute):
            yield f.value.value, f.value.attr, node.lineno


@pytest.fixture(scope="module")
def checker():
    recs = records()
    trees = [ast.parse(p.read_text()) for p in modules().values()]
    return Checker(recs, returns(trees, recs))


def test_every_state_dataclass_is_a_checked_record_or_says_why_not():
    listed = {n for names in RECORDS.values() for n in names}
    bad = []
    for module in ("vradix.core.state", "vradix.request", "vradix.core.crossing", "vradix.core.sessions",
                   "vradix.core.lora"):
        mod = importlib.import_module(module)
        for name, obj in vars(mod).items():
            if dataclasses.is_dataclass(obj) and obj.__module__ == module and name not in listed | set(NOT_RECORDS):
                bad.append(f"{module}.{name}")
    assert not bad, f"state dataclasses neither in RECORDS nor in NOT_RECORDS: {bad}"


def test_each_record_names_its_writers():
    for owner, names in RECORDS.items():
        mod = importlib.import_module(owner)
        for name in names:
            doc = " ".join((getattr(mod, name).__doc__ or "").split())
            assert "only through" in doc, f"{name}'s docstring does not name the methods it changes through"


def test_no_module_writes_a_record_it_does_not_own(checker):
    bad = [v for module, path in modules().items() for v in checker.violations(path.read_text(), module)]
    assert not bad, "record fields written outside their owner module:\n" + "\n".join(bad)


PLANTED = [
    ("def f(state):\n    state.freed.tokens_total += 1\n", "state.freed.tokens_total (FreedCounters"),
    ("from vradix import request\ndef f(req):\n    s = request.of(req)\n    s.crossed = True\n", "s.crossed (ReqState"),
    ("def f(x: Engine):\n    setattr(x, 'label', 'v2')\n", "x.label (Engine"),
    ("def f(state, req):\n    state.crossing[id(req)] = req\n", "state.crossing (Engine"),
    ("def f(state, req):\n    state.crossing.held[id(req)] = req\n", "state.crossing.held (CrossingRequests"),
    ("def f(state, sid):\n    state.sessions.stale_slots.pop(sid)\n", "state.sessions.stale_slots (SessionSlots"),
    ("def f(state, k):\n    state.lora.adapter_ids.pop(k, None)\n", "state.lora.adapter_ids (LoraRecord"),
    ("def f(scheduler):\n    inv = bump_scheduler(scheduler, reason='r')\n    inv.drain_ms = 1.0\n",
     "inv.drain_ms (Bump"),
    ("def f(state):\n    q = state.deferred\n    q.pending_tokens, q.active = 0, False\n",
     "q.pending_tokens (DeferredReclaim"),
    ("def f(st: 'request.ReqState'):\n    del st.crossings[0]\n", "st.crossings (ReqState"),
    ("def f():\n    r = Bump(0, 1, None, 'r')\n    r.tokens_freed = 3\n", "r.tokens_freed (Bump"),
]


@pytest.mark.parametrize("source, reported", PLANTED)
def test_the_check_reports_a_planted_write(checker, source, reported):
    """The check itself can fail: a record write planted in a module that does not own the record is reported."""
    found = checker.violations(source, "vradix.hooks.planted")
    assert any(reported in v for v in found), found


@pytest.mark.parametrize("source", [
    "def f(stats):\n    stats.deferred += 1\n",  # a DedupStats, whose field shares a name with Engine's
    "def f(cache):\n    bucketed = cache.bucketed\n    bucketed.buckets = 0\n",  # assigned from no record
    "def f(req):\n    req.extra_key = None\n",
])
def test_the_check_leaves_other_objects_alone(checker, source):
    assert checker.violations(source, "vradix.hooks.planted") == []


def test_the_owner_module_may_write_its_record(checker):
    source = "def defer(state, cache):\n    q = state.deferred\n    q.active = True\n"
    assert checker.violations(source, "vradix.core.deferred_reclaim") == []
    assert checker.violations(source, "vradix.core.epochs") != []


def test_a_requests_epoch_and_history_are_read_from_one_bind():
    """`epoch` and `kv_history` are derived from the bind and the crossings: a crossing before any position was
    computed replaces the bind's entry in the history (it owns no positions) and leaves the namespace epoch alone."""
    from vradix.request import HistoryEntry, ReqState

    st = ReqState(None, HistoryEntry(0, 3, "a", "w3"))
    assert (st.epoch, st.kv_history) == (3, [(0, 3, "a", "w3")])
    st.cross(HistoryEntry(0, 4, "b", "w4"))
    st.cross(HistoryEntry(5, 5, "c", "w5"))
    st.cross(HistoryEntry(5, 6, "d", "w6"))
    assert st.epoch == 3 and st.kv_history == [(0, 4, "b", "w4"), (5, 6, "d", "w6")]
    st.bind(HistoryEntry(0, 6, "d", "w6"))
    assert (st.epoch, st.kv_history, st.pd_handoff) == (6, [(0, 6, "d", "w6")], None)


def test_the_last_bump_is_the_later_of_the_last_publication_and_the_last_flush():
    from vradix.engine import Engine
    from vradix.core.state import Bump

    state = Engine(tree_core="t")
    assert state.last is None
    keep = state._keep_bump  # what `finish_bump` and `record_reset` end with
    publication = Bump(0, 1, "a", "update")
    keep(publication, is_publication=True)
    assert state.last is publication and state.last_flush is None
    idle = Bump(1, 1, "a", "flush (idle reset)")  # keeps the epoch: later than the publication
    keep(idle, is_publication=False)
    assert state.last is idle and state.last_publication is publication
    again = Bump(1, 2, "b", "update")
    keep(again, is_publication=True)
    assert state.last is again
    flush = Bump(2, 3, "b", "lock-aware flush")
    keep(flush, is_publication=False)
    assert state.last is flush and state.last_publication is again
