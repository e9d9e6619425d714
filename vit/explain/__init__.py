"""Where the model looks: attention and gradient `rollout`, and token deletion/insertion `faithfulness`.
Import by module."""
