"""Where the model looks: attention and gradient `rollout`, token deletion/insertion `faithfulness`, and the
local `demo` page (top-5 and the rollout overlay of an uploaded image), and `overlays` (predict.py --cam's
pictures). Import by module."""
