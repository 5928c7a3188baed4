"""Static files of the GradViz tab, served by `tb_gradviz.board.plugin`.

A regular package on purpose: setuptools' editable install cannot find a
namespace sub-package mapped to another folder (`tb_gradviz.board.frontend` ->
`frontend/`), so without this file `importlib.resources` misses the frontend.
"""
