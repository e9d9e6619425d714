"""Where the model looks: attention and gradient `rollout`, token deletion/insertion `faithfulness`, and the
local `demo` page (top-5 and the rollout overlay of an uploaded image; a segmentation checkpoint's in `seg_demo`),
`overlays` (predict.py --cam's
pictures), and visualize_attention.py's `attention_inputs` and `attention_figures` (draw_attention).
Import by module."""
