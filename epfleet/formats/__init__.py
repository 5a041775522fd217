"""What epfleet writes for other programs to read, as pure pydantic models and functions:
the fleet spec (``spec``, read from its YAML file by ``spec_file``), the manifest and
what it records of each variant (``manifest``, ``variant_checks``), the device report
(``device_report``), and where every object lives in a store (``keys``). Modules here
import only ``epfleet.hashing``, ``epfleet.errors``, ``epfleet.stores.base`` (key
checks) and ``eps`` (EP facts): no I/O but reading a spec file."""
