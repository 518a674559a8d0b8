"""The region layer: a verifiable part too big for one search is cut into regions, each searched
on its own, and the part's answer is the cheapest cover of it by the kernels found."""

from .candidates import atoms, floor_groups, search_regions
from .region import PartDag, Region, canonical, extract

__all__ = ["PartDag", "Region", "canonical", "extract", "atoms", "floor_groups", "search_regions"]
