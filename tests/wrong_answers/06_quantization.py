"""Realistic wrong answers for solutions/06_quantization.ipynb; each must lose points (see docs/COURSE_PIPELINE.md)."""

# name -> list of (grade_id of an answer cell, exact text in the solution, replacement text)
WRONG = {
    # Truncates instead of rounding: errors up to a whole step instead of half of one.
    "floor_not_round": [
        ("quantize_int8", "torch.round((xf - zero.float()) / step)", "torch.floor((xf - zero.float()) / step)"),
    ],
    # Symmetric scale from max |x| and no zero point: negative numbers are clamped to code 0.
    "no_zero_point": [
        ("quantize_int8", "scale = ((hi - lo) / 255).to(x.dtype)",
         "scale = (xf.abs().amax(dim=dim, keepdim=True) / 255).to(x.dtype)"),
        ("quantize_int8", "zero = lo.to(x.dtype)", "zero = torch.zeros_like(lo).to(x.dtype)"),
    ],
    # 256 levels means 255 steps; dividing the range by 256 puts the maximum out of reach of code 255.
    "256_steps": [
        ("quantize_int8", "scale = ((hi - lo) / 255).to(x.dtype)", "scale = ((hi - lo) / 256).to(x.dtype)"),
    ],
    # Keys quantized per token, like the values: the outlier channels set every token's step.
    "keys_per_token": [
        ("int8_cache", "self.k_blocks[layer].append(quantize_int8(old_k, dim=-2))",
         "self.k_blocks[layer].append(quantize_int8(old_k, dim=-1))"),
    ],
    # No residual window: every complete group is quantized at once, the newest tokens too.
    "no_residual_window": [
        ("int8_cache", "while self.k_res[layer].shape[2] - self.residual >= G:", "while self.k_res[layer].shape[2] >= G:"),
    ],
    # Counts the codes and the residual but forgets the scales and zero points.
    "bytes_without_scales": [
        ("int8_cache", "for block in blocks for t in block]", "for block in blocks for t in block[:1]]"),
    ],
    # Counts one byte per element for everything (the residual too, which is fp32/fp16).
    "bytes_one_per_element": [
        ("int8_cache", "return sum(t.numel() * t.element_size() for t in stored)", "return sum(t.numel() for t in stored)"),
    ],
    # Skips "compute in float32": the codes are computed in the input's fp16/bf16 arithmetic.
    "quantize_in_half_precision": [
        ("quantize_int8", "xf = x.float()", "xf = x"),
        ("quantize_int8", "step = scale.float().masked_fill", "step = scale.masked_fill"),
        ("quantize_int8", "torch.round((xf - zero.float()) / step)", "torch.round((xf - zero) / step)"),
    ],
    # Skips "use the rounded values": the codes use the float32 scale and zero before they are rounded to the dtype.
    "codes_with_unrounded_scale": [
        ("quantize_int8", "step = scale.float().masked_fill(scale == 0, 1.0)",
         "step = ((hi - lo) / 255).masked_fill(scale == 0, 1.0)"),
        ("quantize_int8", "torch.round((xf - zero.float()) / step)", "torch.round((xf - lo) / step)"),
    ],
    # Skips "computed in float32" in dequantize: codes * scale + zero in fp16/bf16 rounds twice.
    "dequantize_in_half_precision": [
        ("quantize_int8", "return (codes.float() * scale.float() + zero.float()).to(scale.dtype)",
         "return codes.to(scale.dtype) * scale + zero"),
    ],
    # No clamp before the cast: in bf16 the scale can round down, the maximum's code rounds to 256 and uint8 wraps
    # it to 0 (float32 never shows it: the scale is not rounded there).
    "codes_not_clamped": [
        ("quantize_int8", "torch.round((xf - zero.float()) / step).clamp(0, 255).to(torch.uint8)",
         "torch.round((xf - zero.float()) / step).to(torch.uint8)"),
    ],
    # Reads "as long as more than R would remain" literally: a group leaves only when R + 1 or more stay, so the
    # residual holds R + 1 .. R + G tokens (one group too many whenever it holds exactly R + G).
    "residual_keeps_more_than_r": [
        ("int8_cache", "while self.k_res[layer].shape[2] - self.residual >= G:",
         "while self.k_res[layer].shape[2] - self.residual > G:"),
    ],
    # The warm-up's code truncated instead of rounded to the nearest step.
    "code_of_truncates": [("code_of", "    return round((x - lo) / scale)", "    return int((x - lo) / scale)")],
    # The warm-up's code counted on a grid of 256 steps.
    "code_of_256_steps": [("code_of", "scale = (hi - lo) / 255", "scale = (hi - lo) / 256")],
}
