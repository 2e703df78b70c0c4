"""How jobs reach the table, one subject a module, behind `sqla_queue.enqueue`: the
statement parameters of a prepared job (`params`), the COPY writer (`copy`), unique jobs
(`unique`), `enqueue_many` (`bulk`), waking workers once per queue per transaction (`wake`)
and the clear errors for rows the database refused (`refusals`). Internal: import the
public names from `sqla_queue` or `sqla_queue.enqueue`.
"""
