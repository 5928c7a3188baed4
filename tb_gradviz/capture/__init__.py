"""The capture: the Keras callback and its probe pass, on every backend.

Which layers (`selection`), one pass per log event (`probe` and
`backends/`), the statistics of captured tensors (`kernels`, `assemble`) and
the weight side (`weights`). The only side that imports Keras and a
framework; it writes through `tb_gradviz.format`.
"""
