"""Recipes: the fixes that worked, with their evidence, as versioned data (``gd.Recipe``)."""

from __future__ import annotations

from gpudiag.recipe.model import SCHEMA_VERSION, Evidence, Recipe, RecipeFix

__all__ = ["SCHEMA_VERSION", "Evidence", "Recipe", "RecipeFix"]
