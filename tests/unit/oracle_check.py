"""Check a problem's five batched oracles against autograd of f_i and g_i written out by hand."""

import numpy as np
import torch


def assert_oracles_match_autograd(prob, ids, f_g, seed=0):
    """``f_g(i, x, y) -> (f_i, g_i)`` for client ``i``; compares every oracle and the per-client
    values ``outer_value`` / ``inner_value`` row by row."""
    gen = torch.Generator().manual_seed(seed)
    n = len(ids)
    X = torch.randn(n, prob.dim_x, dtype=torch.float64, generator=gen)
    Y = torch.randn(n, prob.dim_y, dtype=torch.float64, generator=gen)
    V = torch.randn(n, prob.dim_y, dtype=torch.float64, generator=gen)
    ids = np.asarray(ids)
    got = {
        "grad_x_outer": prob.grad_x_outer(ids, X, Y, None),
        "grad_y_outer": prob.grad_y_outer(ids, X, Y, None),
        "grad_y_inner": prob.grad_y_inner(ids, X, Y, None),
        "hvp_yy_inner": prob.hvp_yy_inner(ids, X, Y, V, None),
        "jvp_xy_inner": prob.jvp_xy_inner(ids, X, Y, V, None),
    }
    values = {"f": prob.outer_value(ids, X, Y), "g": prob.inner_value(ids, X, Y)}
    for b, i in enumerate(ids):
        x, y = X[b].clone().requires_grad_(), Y[b].clone().requires_grad_()
        f, g = f_g(int(i), x, y)
        torch.testing.assert_close(values["f"][b], f.detach(), rtol=1e-12, atol=1e-12, msg="outer_value")
        torch.testing.assert_close(values["g"][b], g.detach(), rtol=1e-12, atol=1e-12, msg="inner_value")
        fx, fy = torch.autograd.grad(f, (x, y), allow_unused=True, retain_graph=True)
        (gy,) = torch.autograd.grad(g, y, create_graph=True)
        hvp, jvp = torch.autograd.grad(gy @ V[b], (y, x), allow_unused=True)
        want = {
            "grad_x_outer": fx,
            "grad_y_outer": fy,
            "grad_y_inner": gy.detach(),
            "hvp_yy_inner": hvp,
            "jvp_xy_inner": jvp,
        }
        for name, value in want.items():
            value = torch.zeros_like(got[name][b]) if value is None else value
            torch.testing.assert_close(got[name][b], value, rtol=1e-12, atol=1e-12, msg=name)
