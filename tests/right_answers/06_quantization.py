"""Correct answers for notebooks/06_quantization.ipynb written differently from the solution; each must get full marks.

name -> list of (grade_id of an answer cell, exact text in the solution, replacement text), as in tests/wrong_answers/.
"""

READ = ("        k_old = [dequantize_int8(*block) for block in self.k_blocks[layer]]  # each (B, H_kv, G, D)\n"
        "        v_old = [dequantize_int8(*block) for block in self.v_blocks[layer]]\n"
        "        return torch.cat(k_old + [self.k_res[layer]], dim=2), torch.cat(v_old + [self.v_res[layer]], dim=2)")

RIGHT = {
    # aminmax, where() for constant slices, an explicit loop in read().
    "aminmax_where_loop": [
        ("quantize_int8",
         "    lo = xf.amin(dim=dim, keepdim=True)  # (..., 1, ...): one per slice\n"
         "    hi = xf.amax(dim=dim, keepdim=True)\n",
         "    lo, hi = torch.aminmax(xf, dim=dim, keepdim=True)\n"),
        ("quantize_int8",
         "    step = scale.float().masked_fill(scale == 0, 1.0)  # a constant slice: every code 0, x_hat = zero\n",
         "    step = torch.where(scale.float() > 0, scale.float(), torch.ones_like(scale.float()))\n"),
        ("int8_cache", READ,
         "        ks, vs = [], []\n"
         "        for (kc, ksc, kz), (vc, vsc, vz) in zip(self.k_blocks[layer], self.v_blocks[layer]):\n"
         "            ks.append(dequantize_int8(kc, ksc, kz))\n"
         "            vs.append(dequantize_int8(vc, vsc, vz))\n"
         "        ks.append(self.k_res[layer])\n"
         "        vs.append(self.v_res[layer])\n"
         "        return torch.cat(ks, dim=-2), torch.cat(vs, dim=-2)"),
    ],
    # Codes by floor(x / step + 0.5) (round half up, not half to even: both are within half a step),
    # dequantize with addcmul, nbytes from untyped storage sizes, several groups moved at once.
    "floor_half_addcmul": [
        ("quantize_int8", "torch.round((xf - zero.float()) / step)", "torch.floor((xf - zero.float()) / step + 0.5)"),
        ("quantize_int8", "return (codes.float() * scale.float() + zero.float()).to(scale.dtype)",
         "return torch.addcmul(zero.float(), codes.float(), scale.float()).to(scale.dtype)"),
        ("int8_cache", "        return sum(t.numel() * t.element_size() for t in stored)",
         "        return sum(t.nelement() * t.dtype.itemsize for t in stored)"),
        ("int8_cache",
         "        while self.k_res[layer].shape[2] - self.residual >= G:  # the oldest G tokens leave the residual\n"
         "            old_k, old_v = self.k_res[layer][:, :, :G], self.v_res[layer][:, :, :G]  # (B, H_kv, G, D)\n"
         "            self.k_blocks[layer].append(quantize_int8(old_k, dim=-2))  # keys per channel: scale (B, H_kv, 1, D)\n"
         "            self.v_blocks[layer].append(quantize_int8(old_v, dim=-1))  # values per token: scale (B, H_kv, G, 1)\n"
         "            self.k_res[layer] = self.k_res[layer][:, :, G:]\n"
         "            self.v_res[layer] = self.v_res[layer][:, :, G:]\n",
         "        n_groups = max(0, (self.k_res[layer].shape[2] - self.residual) // G)\n"
         "        for g in range(n_groups):\n"
         "            self.k_blocks[layer].append(quantize_int8(self.k_res[layer][:, :, g * G:(g + 1) * G], dim=2))\n"
         "            self.v_blocks[layer].append(quantize_int8(self.v_res[layer][:, :, g * G:(g + 1) * G], dim=3))\n"
         "        self.k_res[layer] = self.k_res[layer][:, :, n_groups * G:]\n"
         "        self.v_res[layer] = self.v_res[layer][:, :, n_groups * G:]\n"),
    ],
}
