"""The board: the GradViz tab in TensorBoard and what it serves.

The plugin (`plugin`), reading through TensorBoard's data provider (`store`,
`catalog`), the answers (`responses`), the training-health flags (`onset`, by the
format's `health` rules) and the tab's static files (`frontend`, installed from the top-level
`frontend/` folder). Imports no deep-learning framework: TensorBoard imports
every installed plugin at start.
"""
