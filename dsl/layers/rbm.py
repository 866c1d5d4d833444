"""Restricted Boltzmann machine (SINGA's RBM layers), trained by contrastive divergence.

In a bp net the layer is the RBM's encoder, v -> P(h = 1 | v), which is how an autoencoder
initialised from stacked RBMs uses it. The `cd` training algorithm calls `cd_loss()` instead.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from dsl.init import ParamSpec
from dsl.layers.base import BuildContext, Layer, LayerConfig, Shape, register_layer

Visible = Literal["binary", "gaussian"]


class RBM(Layer):
    """Weights w (hidden, visible), hidden bias hb, visible bias vb.

    Gaussian visible units have unit variance (the data should be standardised), as in SINGA.
    """

    def __init__(self, visible_size: int, hidden: int, visible: Visible) -> None:
        super().__init__()
        self.visible = visible
        self.w = nn.Parameter(torch.empty(hidden, visible_size))
        self.hb = nn.Parameter(torch.empty(hidden))
        self.vb = nn.Parameter(torch.empty(visible_size))

    def default_param(self, role: str) -> ParamSpec:
        if role == "w":
            return ParamSpec(init="gaussian", std=0.01)
        return ParamSpec(init="constant", value=0.0)

    def hidden_probs(self, v: torch.Tensor) -> torch.Tensor:
        # (B, V) -> (B, H)
        return torch.sigmoid(F.linear(v, self.w, self.hb))

    def visible_mean(self, h: torch.Tensor) -> torch.Tensor:
        # (B, H) -> (B, V): probabilities for binary units, the mean for gaussian ones
        pre = F.linear(h, self.w.t(), self.vb)
        return torch.sigmoid(pre) if self.visible == "binary" else pre

    def free_energy(self, v: torch.Tensor) -> torch.Tensor:
        """F(v) per sample, (B, V) -> (B,); P(v) is proportional to exp(-F(v))."""
        hidden_term = F.softplus(F.linear(v, self.w, self.hb)).sum(1)
        if self.visible == "binary":
            return -(v @ self.vb) - hidden_term
        return 0.5 * (v - self.vb).pow(2).sum(1) - hidden_term

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return self.hidden_probs(v.flatten(1))

    def forward_flops(self, in_shapes: list[Shape], out_shape: Shape | list[Shape]) -> int:
        return 2 * self.w.numel()  # the encoder v -> h: one multiply-add per weight

    def cd_loss(
        self, v0: torch.Tensor, k: int, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, recon_error) for CD-k on the batch `v0`.

        `loss.backward()` leaves the CD-k gradient in the parameters' `.grad`: the loss is the
        free-energy gap between the data and the end of a k-step Gibbs chain started at the data,
        the chain's end taken as a constant. Every step but the last samples the visible units;
        the last keeps their probabilities (binary) or mean (gaussian) to reduce the noise.
        `recon_error` is the mean squared error per visible unit (mean over the batch and the
        units) between `v0` and the first step's reconstruction.
        """
        if k < 1:
            raise ValueError(f"CD-k needs k >= 1 Gibbs steps, got {k}")
        v0 = v0.flatten(1)  # (B, V)
        with torch.no_grad():
            v = v0
            recon = v0
            for step in range(k):
                h = torch.bernoulli(self.hidden_probs(v), generator=generator)
                mean = self.visible_mean(h)
                if step == 0:
                    recon = mean
                if step == k - 1:
                    v = mean
                elif self.visible == "binary":
                    v = torch.bernoulli(mean, generator=generator)
                else:
                    noise = torch.randn(
                        mean.shape, generator=generator, dtype=mean.dtype, device=mean.device
                    )
                    v = mean + noise
            recon_error = F.mse_loss(recon, v0)
        loss = self.free_energy(v0).mean() - self.free_energy(v).mean()
        return loss, recon_error


@register_layer("rbm")
class RBMConfig(LayerConfig):
    """An RBM with `hidden` binary hidden units over the flattened source (the visible units)."""

    terminal: ClassVar[bool] = True

    type: Literal["rbm"]
    hidden: int = Field(gt=0, description="number of hidden units")
    visible: Visible = Field(
        default="binary",
        description="binary: visible units in [0, 1] (probabilities); gaussian: real-valued "
        "units of unit variance (standardise the data)",
    )

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        return RBM(math.prod(in_shapes[0]), self.hidden, self.visible), (self.hidden,)
