"""Registry: registration order, dict-like reads, refused duplicates, and the unknown-name error."""

import pytest

from cua_jax.registry import Registry, UnknownNameError


def _registry():
    shapes = Registry("shape")

    @shapes.register("square")
    def square(x):
        return x * x

    shapes.register("cube")(lambda x: x * x * x)
    return shapes, square


def test_register_returns_the_entry_and_keeps_registration_order():
    shapes, square = _registry()
    assert shapes["square"] is square and shapes["square"](3) == 9
    assert shapes.names() == ("square", "cube") == tuple(shapes) and list(shapes) == ["square", "cube"]
    assert sorted(shapes) == ["cube", "square"] and len(shapes) == 2
    assert "cube" in shapes and "circle" not in shapes and ["square"] not in shapes
    assert dict(shapes.items())["square"] is square and shapes.get("circle") is None
    assert shapes == {"square": square, "cube": shapes["cube"]}


def test_duplicate_registration_is_refused_and_keeps_the_first_entry():
    shapes, square = _registry()
    with pytest.raises(ValueError, match="shape 'square' is already registered"):
        shapes.register("square")(lambda x: x)
    assert shapes["square"] is square and len(shapes) == 2
    with pytest.raises(ValueError, match="non-empty string"):
        shapes.register("")


def test_unknown_name_error_names_the_kind_the_name_and_the_known_names():
    shapes, _ = _registry()
    with pytest.raises(ValueError) as error:
        shapes["circle"]
    assert str(error.value) == "unknown shape 'circle'; known: ['cube', 'square']"
    # Also the KeyError of a dict lookup, for code written against plain dicts.
    assert isinstance(error.value, KeyError)
    with pytest.raises(UnknownNameError, match="unknown shape"):
        shapes[["square"]]
