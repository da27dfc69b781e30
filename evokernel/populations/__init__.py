"""Populations: the protocol, island pools, the elite archive and MAP-Elites."""

from evokernel.populations.archive import EliteArchive
from evokernel.populations.base import Entry, Population, better, population_from_state
from evokernel.populations.islands import Host, Islands, in_process
from evokernel.populations.map_elites import Axis, MapElites
from evokernel.populations.pool import TournamentPool

__all__ = [
    "Axis",
    "EliteArchive",
    "Entry",
    "Host",
    "Islands",
    "MapElites",
    "Population",
    "TournamentPool",
    "better",
    "in_process",
    "population_from_state",
]
