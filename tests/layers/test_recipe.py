"""``Recipe`` (NUMERICS §§6-7): builders, TE's defaults, repr and errors."""

from __future__ import annotations

import dataclasses

import pytest

from lowprec_moe import Recipe


def test_bf16():
    r = Recipe.bf16()
    assert r.name == "bf16" and not r.quantized and r.format is None
    assert not (r.rht or r.stochastic_rounding or r.row_scaled_activation or r.weight_2d)
    assert repr(r) == "Recipe.bf16()"


def test_mxfp8_defaults():
    r = Recipe.mxfp8()
    assert r.quantized and r.format == "mxfp8"
    assert r.fp8_format == "e4m3" and r.weight_2d is False
    assert r.x_fp8_dtype == "e4m3" and r.dy_fp8_dtype == "e4m3"
    assert not (r.rht or r.stochastic_rounding or r.row_scaled_activation)


def test_mxfp8_hybrid():
    """TE's "hybrid": E4M3 forward (x, W), E5M2 for the gradient dy."""
    r = Recipe.mxfp8(fp8_format="hybrid", weight_2d=True)
    assert r.x_fp8_dtype == "e4m3" and r.dy_fp8_dtype == "e5m2" and r.weight_2d is True


def test_nvfp4_defaults_follow_te():
    """TE's NVFP4 recipe: 16x16 weight blocks, RHT on the wgrad operands and stochastic rounding
    of the gradient, all on by default."""
    r = Recipe.nvfp4()
    assert r.format == "nvfp4" and r.quantized
    assert r.weight_2d is True and r.rht is True and r.stochastic_rounding is True
    assert r.row_scaled_activation is False
    r = Recipe.nvfp4(rht=False, stochastic_rounding=False, weight_2d=False)
    assert (r.rht, r.stochastic_rounding, r.weight_2d) == (False, False, False)
    assert Recipe.nvfp4(rht=False).stochastic_rounding is True
    assert Recipe.nvfp4(stochastic_rounding=False).rht is True


def test_nvfp4_row_scaled_turns_rht_and_sr_off():
    r = Recipe.nvfp4(row_scaled_activation=True)
    assert r.row_scaled_activation is True
    assert r.rht is False and r.stochastic_rounding is False and r.weight_2d is True
    # asking explicitly for them to be off is fine
    assert Recipe.nvfp4(row_scaled_activation=True, rht=False, stochastic_rounding=False) == r


@pytest.mark.parametrize("r", [
    Recipe.bf16(), Recipe.mxfp8(), Recipe.mxfp8("hybrid", weight_2d=True), Recipe.nvfp4(),
    Recipe.nvfp4(weight_2d=False, rht=False), Recipe.nvfp4(row_scaled_activation=True),
], ids=repr)
def test_repr_round_trips(r):
    text = repr(r)
    assert text.startswith(f"Recipe.{r.name}(")
    assert eval(text, {"Recipe": Recipe}) == r


def test_repr_text():
    assert repr(Recipe.mxfp8("hybrid")) == "Recipe.mxfp8(fp8_format='hybrid', weight_2d=False)"
    assert repr(Recipe.nvfp4()) == ("Recipe.nvfp4(row_scaled_activation=False, weight_2d=True, "
                                    "rht=True, stochastic_rounding=True)")


def test_frozen_and_hashable():
    r = Recipe.nvfp4()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.rht = False
    assert r == Recipe.nvfp4() and hash(r) == hash(Recipe.nvfp4())
    assert r != Recipe.nvfp4(rht=False)
    assert len({Recipe.bf16(), Recipe.bf16(), Recipe.mxfp8()}) == 2


@pytest.mark.parametrize("opt", ["rht", "stochastic_rounding"])
def test_nvfp4_conflicts(opt):
    with pytest.raises(ValueError, match=f"row_scaled_activation=True cannot be combined with "
                                         f"{opt}=True"):
        Recipe.nvfp4(row_scaled_activation=True, **{opt: True})


@pytest.mark.parametrize("fmt", ["e5m2", "E4M3", None, "fp8"])
def test_mxfp8_bad_format(fmt):
    with pytest.raises(ValueError, match="fp8_format"):
        Recipe.mxfp8(fp8_format=fmt)


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="fp8"), "name"),
    (dict(name="nvfp4", row_scaled_activation=True, rht=True), "rht"),
    (dict(name="nvfp4", row_scaled_activation=True, stochastic_rounding=True),
     "stochastic_rounding"),
    (dict(name="mxfp8", rht=True), "nvfp4 option"),
    (dict(name="mxfp8", stochastic_rounding=True), "nvfp4 option"),
    (dict(name="bf16", row_scaled_activation=True), "nvfp4 option"),
    (dict(name="nvfp4", fp8_format="hybrid"), "mxfp8 option"),
    (dict(name="mxfp8", fp8_format="e5m2"), "fp8_format"),
    (dict(name="bf16", weight_2d=True), "weight_2d"),
])
def test_direct_construction_is_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Recipe(**kwargs)


def test_replace_is_checked():
    with pytest.raises(ValueError, match="rht"):
        dataclasses.replace(Recipe.nvfp4(row_scaled_activation=True), rht=True)
    assert dataclasses.replace(Recipe.nvfp4(), rht=False) == Recipe.nvfp4(rht=False)
