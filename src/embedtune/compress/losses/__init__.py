"""DIVE's training objectives, one per file; each exposes a pure function for the maths.

The supervised mode trains on the first three; the unsupervised mode replaces the triplet term
by neighbour-rank distillation on the corpus."""

from embedtune.compress.losses.geometry_distillation import GeometryDistillationLoss, geometry_distillation_loss
from embedtune.compress.losses.headwise_ntxent import HeadwiseNTXentLoss, headwise_ntxent_loss
from embedtune.compress.losses.neighbor_rank_distillation import NeighborRankDistillationLoss, neighbor_rank_distillation_loss
from embedtune.compress.losses.self_limiting_triplet import SelfLimitingTripletLoss, self_limiting_triplet_loss

__all__ = [
    "GeometryDistillationLoss",
    "HeadwiseNTXentLoss",
    "NeighborRankDistillationLoss",
    "SelfLimitingTripletLoss",
    "geometry_distillation_loss",
    "headwise_ntxent_loss",
    "neighbor_rank_distillation_loss",
    "self_limiting_triplet_loss",
]
