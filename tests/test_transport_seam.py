"""A weight transport is one module of grpo_ray/transports (its TRANSPORT class) and one recipe value; a user's
own is module:Class. Both are checked before any actor starts."""

import pytest

from grpo_ray import transports
from grpo_ray.config import RecipeError, load_recipe
from grpo_ray.transports.base import Transport
from grpo_ray.transports.collective import Collective
from grpo_ray.transports.storage import Storage
from tests.conftest import ROOT


class Pigeon(Transport):
    """A transport of a user's own, for the test: nothing sent."""

    name = "pigeon"
    checked: list = []

    def __init__(self, recipe):
        self.recipe = recipe

    @classmethod
    def check(cls, recipe) -> None:
        cls.checked.append(recipe.trainer.weight_transport)


def recipe(*flags):
    return load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", list(flags))


def test_a_transport_is_found_by_its_module_name_or_as_module_class(tmp_path):
    assert transports.available() == ["collective", "delta", "delta_storage", "storage"]
    assert transports.transport_class("collective") is Collective
    assert isinstance(transports.build(recipe(f"trainer.output_dir={tmp_path}")), Collective)
    assert isinstance(transports.build(recipe("trainer.weight_transport=storage")), Storage)
    mine = recipe(f"trainer.weight_transport={__name__}:Pigeon")
    transports.check(mine)
    assert Pigeon.checked == [f"{__name__}:Pigeon"] and isinstance(transports.build(mine), Pigeon)


@pytest.mark.parametrize(
    "value, said",
    [
        (
            "rdma",
            "trainer.weight_transport='rdma': expected one of collective, delta, delta_storage, storage "
            "(grpo_ray/transports/)",
        ),
        ("base", "trainer.weight_transport='base': expected one of collective, delta, delta_storage, storage"),
        (f"{__name__}:recipe", "is not a grpo_ray.transports.base.Transport subclass"),
        ("no_such_module:Thing", "trainer.weight_transport='no_such_module:Thing': cannot import no_such_module"),
    ],
)
def test_an_unknown_transport_is_one_line_naming_the_key(value, said):
    with pytest.raises(RecipeError) as e:
        transports.check(recipe(f"trainer.weight_transport={value}"))
    assert said in str(e.value)
