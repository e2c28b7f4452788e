"""A pytest plugin for ``test_pulsar_heap``'s child runs: the Pulsar backend's readers get
a receiver queue of 10 messages instead of 1000 (more, smaller deliveries from the
broker, and flow permits sent every few messages), which makes pulsar-client's heap
corruption under churning readers show far more often (see ``test_pulsar_heap``)."""

from __future__ import annotations

import walsvc.backends._pulsar._log as _log

#: The receiver queue of every reader the backend creates in the child.
SMALL_QUEUE = 10

_log.BATCH = SMALL_QUEUE
