"""The options dataclasses mirror the C++ structs: the same fields, the same defaults, names for enums."""

import dataclasses

import flashcache as fc
import pytest
from flashcache import _core


def core_fields(obj):
    return sorted(n for n in dir(type(obj)) if isinstance(getattr(type(obj), n), property))


MIRRORS = [
    (fc.Options, _core.Options),
    (fc.ScoreOptions, _core.ScoreOptions),
    (fc.SelectOptions, _core.SelectOptions),
    (fc.AllocateOptions, _core.AllocateOptions),
    (fc.RopeOptions, _core.RopeOptions),
    (fc.SharedKeepOptions, _core.SharedKeepOptions),
    (fc.QueryTailOptions, _core.QueryTailOptions),
    (fc.ArchiveOptions, _core.ArchiveOptions),
]


@pytest.mark.parametrize("py, cpp", MIRRORS, ids=[p.__name__ for p, _ in MIRRORS])
def test_every_cpp_field_is_mirrored_with_its_default(py, cpp):
    c = cpp()
    assert sorted(f.name for f in dataclasses.fields(py)) == core_fields(c)
    converted = py()._to_core()
    for name in core_fields(c):
        want, got = getattr(c, name), getattr(converted, name)
        if isinstance(want, (int, float, bool)) or hasattr(want, "name"):
            assert got == want, name


def test_presets_match_the_cpp_ones():
    paper = fc.Options.paper()
    assert paper.score.base == fc.Base.lowpass and paper.score.gamma == 0.2
    assert paper.select.sink == 0 and paper.select.window_share == 0.0
    tail = fc.Options.with_query_tail()
    assert tail.score.query == fc.QueryInput.tail and tail.score.tail_mix == fc.TailMix.max
    assert fc.QueryTailOptions.last_queries(1000).from_position == 1000 - _core.TAIL_LAST_QUERIES


def test_enums_by_name_and_unknown_names_refused():
    assert fc.ScoreOptions(base="lowpass").base is fc.Base.lowpass
    assert fc.ScoreOptions(transform=fc.Transform.blocked).transform is fc.Transform.blocked
    assert fc.ScoreOptions(mean_mix="max").mean_mix is fc.TailMix.max
    assert fc.ScoreOptions(mean_distance="key_cosine").mean_distance is fc.MeanDistance.key_cosine
    with pytest.raises(ValueError, match="ScoreOptions.base: 'lowpas' is not one of lowpass, peak, mixed"):
        fc.ScoreOptions(base="lowpas")


def test_enum_names_assigned_after_construction_reach_cpp():
    options = fc.Options()
    options.score.transform = "blocked"  # a plain attribute assignment: converted when the call is made
    assert options._to_core().score.transform == fc.Transform.blocked
    options.score.base = "lowpas"
    with pytest.raises(ValueError, match="ScoreOptions.base: 'lowpas' is not one of"):
        options._to_core()


@pytest.mark.parametrize(
    "options, message",
    [
        (fc.Options(score=fc.ScoreOptions(gamma=0.0)), "gamma 0 is outside"),
        (fc.Options(score=fc.ScoreOptions(gamma=float("nan"))), "gamma nan is outside"),
        (fc.Options(select=fc.SelectOptions(window_share=1.5)), "window_share 1.5 is outside"),
        (fc.Options(score=fc.ScoreOptions(mean_weight=2.0)), "mean_weight 2 is outside"),
        (fc.Options(allocate=fc.AllocateOptions(min_layer_ratio=-0.1)), "min_layer_ratio -0.1 is outside"),
    ],
)
def test_bad_options_are_refused_by_name(options, message):
    with pytest.raises(fc.Error, match=message):
        _core.check_options(options._to_core())
    assert issubclass(fc.Error, ValueError)


def test_the_type_stubs_ship_beside_the_module_and_name_it_all():
    import ast
    import pathlib

    stub = pathlib.Path(_core.__file__).with_name("_core.pyi")
    tree = ast.parse(stub.read_text())
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    public = {n for n in dir(_core) if not n.startswith("_") and callable(getattr(_core, n))}
    assert public <= names, public - names
