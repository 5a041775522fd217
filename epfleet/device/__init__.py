"""The device engine: keep a device's cache supplied with the best variant of every model.

One sync is a ``session.SyncSession``: it holds the cache's lock, fetches the manifest
(``manifest_cache``), discovers the local EPs once (``local_eps``) and starts one worker
process. For each model (``model_sync``) it judges the published variants by their
compatibility strings, decides what to try (``selection``, pure) and runs those steps
(``steps``: download via ``fetching`` and ``download``, string check, ``health`` check,
a build here via ``local_build``, fallback; a variant or source of several files is
fetched and assembled by ``variant_sets``) until one installs a variant in the cache
(the ``cache`` subpackage: its paths, state, space, lock, repair and the package
manifest), which then becomes active (``activation``, pure).
While one model is synced, ``prefetch`` downloads the file the next one will download
first. ``policy`` is what a sync is asked to do; ``unlisted`` drops the models the
manifest no longer lists when it is asked to; ``reporting`` names the device and uploads
its report when it says something new; ``jitter`` is where in its interval a device
polls.
A failure at any step keeps the previous active variant.

The fleet side never imports this package: the device report it writes is a shared
format in ``epfleet.formats.device_report``.
"""
