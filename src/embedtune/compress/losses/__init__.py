"""DIVE's three training objectives, one per file; each exposes a pure function for the maths."""

from embedtune.compress.losses.geometry_distillation import GeometryDistillationLoss, geometry_distillation_loss
from embedtune.compress.losses.headwise_ntxent import HeadwiseNTXentLoss, headwise_ntxent_loss
from embedtune.compress.losses.self_limiting_triplet import SelfLimitingTripletLoss, self_limiting_triplet_loss

__all__ = [
    "GeometryDistillationLoss",
    "HeadwiseNTXentLoss",
    "SelfLimitingTripletLoss",
    "geometry_distillation_loss",
    "headwise_ntxent_loss",
    "self_limiting_triplet_loss",
]
