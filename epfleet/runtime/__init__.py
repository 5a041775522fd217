"""ONNX Runtime at work, shared by the compile host and the device: what a compile is asked
to build (``requests``), compiling it (``compiler``, with ``shapes`` and ``filesets``),
quantising it (``quantize``), opening sessions and running samples (``sessions``,
``samples``), and the worker processes all of it runs in (``compile_pool``,
``workers``). It may import ``formats``, ``stores`` and the top-level helpers, never the
fleet side, the device engine, trust or the CLI."""
