"""The S3 store (``s3://bucket/prefix``), one unit: ``S3Store`` and the registry's ``from_uri``.

Its modules, by concern: ``store`` (the store: reads, conditional writes, listings),
``client`` (the shared boto3 clients), ``bounds`` (time bounds on each request),
``errors`` (boto3 failures as epfleet errors), ``transfers`` (multipart upload, parallel
ranged download), ``multipart`` (incomplete multipart uploads) and ``aging`` (touch,
delete if older). Code outside this package imports from here: the store, and the two
answers ``epfleet.stores.probe`` reads when it asks whether a bucket is there.
"""

from epfleet.stores.s3.errors import missing_bucket, status_of
from epfleet.stores.s3.store import S3Store, from_uri

__all__ = ["S3Store", "from_uri", "missing_bucket", "status_of"]
