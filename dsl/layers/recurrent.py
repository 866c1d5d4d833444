"""Recurrent layers (rnn, lstm, gru) over per-sample sequences (T, F), wrapping torch's kernels.

The layers are stateful: the final hidden state of one call starts the next, so the bptt
algorithm can feed a long sequence in chunks (it calls `reset_state()` between sequences and
`detach_state()` between chunks). A bidirectional layer's backward direction would need the
*future* of the sequence, which the next chunk has not given yet, so carrying its state is
meaningless: bidirectional layers start every call from zeros.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from dsl.layers.base import (
    BuildContext,
    LayerConfig,
    Shape,
    StatefulLayer,
    expect_rank,
    register_layer,
)

State = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


class Recurrent(StatefulLayer):
    def __init__(self, rnn: nn.RNNBase, output: Literal["sequence", "last"]) -> None:
        super().__init__()
        self.rnn = rnn
        self.output = output

    def param_role(self, local_name: str) -> str:
        # torch names them rnn.weight_ih_l0, rnn.bias_hh_l1_reverse, ...
        return "w" if local_name.startswith("rnn.weight") else "b"

    def _start_state(self, batch: int) -> State | None:
        if self.rnn.bidirectional or self.state is None:
            return None
        # A state from a batch of another size (the last, shorter batch of an epoch) belongs to
        # other sequences: start those from zeros.
        first = self.state[0] if isinstance(self.state, tuple) else self.state
        return self.state if first.shape[1] == batch else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x (B, T, F) -> out (B, T, H * dirs); state (layers * dirs, B, H) [, cell state]
        out, state = self.rnn(x, self._start_state(x.shape[0]))
        if not self.rnn.bidirectional:
            self.state = state
        if self.output == "sequence":
            return out
        if not self.rnn.bidirectional:
            return out[:, -1]
        # The backward direction ends at the first time step: its final output is there.
        hidden = self.rnn.hidden_size
        return torch.cat([out[:, -1, :hidden], out[:, 0, hidden:]], dim=1)  # (B, 2H)

    def forward_flops(self, in_shapes: list[Shape], out_shape: Shape | list[Shape]) -> int:
        # Every weight matrix (input and hidden, every stacked layer and direction) takes a
        # multiply-add per weight at each of the T steps of the source (T, F).
        weights = sum(p.numel() for name, p in self.rnn.named_parameters() if "weight" in name)
        return 2 * weights * in_shapes[0][0]


class RecurrentConfig(LayerConfig):
    """Keys shared by rnn, lstm and gru."""

    hidden: int = Field(gt=0, description="size of the hidden state per direction")
    num_layers: int = Field(default=1, gt=0, description="number of stacked recurrent layers")
    bidirectional: bool = Field(
        default=False,
        description="also run the sequence backwards and concatenate both directions' outputs; "
        "such a layer cannot carry state between chunks and starts each call from zeros",
    )
    dropout: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="dropout ratio on the outputs of each stacked layer but the last",
    )
    output: Literal["sequence", "last"] = Field(
        default="sequence",
        description="sequence: every time step's output (T, H * dirs); last: the final output "
        "of each direction (H * dirs,), the forward one at the last step and the backward one "
        "at the first",
    )

    @model_validator(mode="after")
    def _dropout_needs_stack(self) -> RecurrentConfig:
        if self.dropout > 0 and self.num_layers == 1:
            raise ValueError(
                "dropout acts between stacked layers, so it needs num_layers > 1; "
                "add a dropout layer after this one instead"
            )
        return self

    def make_rnn(self, features: int) -> nn.RNNBase:
        raise TypeError(f"layer type {self.type!r} defines no recurrent kernel")

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Recurrent, Shape]:
        expect_rank(in_shapes[0], (2,), "a sequence (T, F)")
        steps, features = in_shapes[0]
        width = self.hidden * (2 if self.bidirectional else 1)
        shape = (steps, width) if self.output == "sequence" else (width,)
        return Recurrent(self.make_rnn(features), self.output), shape

    def _kernel_args(self, features: int) -> dict[str, Any]:
        return {
            "input_size": features,
            "hidden_size": self.hidden,
            "num_layers": self.num_layers,
            "bidirectional": self.bidirectional,
            "dropout": self.dropout,
            "batch_first": True,
        }


@register_layer("rnn")
class RNNConfig(RecurrentConfig):
    """Elman recurrent layer: h_t = nonlinearity(W_ih x_t + W_hh h_(t-1) + b)."""

    type: Literal["rnn"]
    nonlinearity: Literal["tanh", "relu"] = "tanh"

    def make_rnn(self, features: int) -> nn.RNNBase:
        return nn.RNN(nonlinearity=self.nonlinearity, **self._kernel_args(features))


@register_layer("lstm")
class LSTMConfig(RecurrentConfig):
    """Long short-term memory; its state is the pair (hidden, cell)."""

    type: Literal["lstm"]

    def make_rnn(self, features: int) -> nn.RNNBase:
        return nn.LSTM(**self._kernel_args(features))


@register_layer("gru")
class GRUConfig(RecurrentConfig):
    """Gated recurrent unit (SINGA's GRU layer)."""

    type: Literal["gru"]

    def make_rnn(self, features: int) -> nn.RNNBase:
        return nn.GRU(**self._kernel_args(features))
