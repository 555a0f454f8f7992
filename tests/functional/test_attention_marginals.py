"""MAN attention plots read the marginals of each input, whatever the attention mode."""

import torch


def test_man_marginals_from_the_exact_tensor_sum_the_other_axes():
    from polyfuse.functional.multilinear import attention_marginals

    attention = torch.arange(2 * 3 * 4 * 5, dtype=torch.float64).reshape(1, 2, 3, 4, 5)
    first, second, third = attention_marginals(attention, 3)
    assert first[0, 1, 2] == sum(attention[0, 1, 2, b, c] for b in range(4) for c in range(5))
    assert second[0, 0, 3] == sum(attention[0, 0, a, 3, c] for a in range(3) for c in range(5))
    assert third.shape == (1, 2, 5) and third[0, 1, 4] == sum(attention[0, 1, a, b, 4] for a in range(3) for b in range(4))
    given = [torch.ones(1, 2, 3)]
    assert attention_marginals(given, 1) is given  # had mode hands the marginals over
