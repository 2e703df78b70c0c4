"""Administration as Python calls, one module per thing administered:

- `jobs`: finding, retrying, cancelling, deleting and pruning jobs; stats and workflows;
- `queues`: creating queues and their settings (pause, rate, concurrency, retention, route);
- `partitions`: fair queues, partition limits and weights, aging, sequences on failure;
- `workers`: the registered and stopped workers;
- `filters`: every job matching a filter, in batches (what `jobs retry|cancel|delete` runs).

The names below are the public admin API (`from sqla_queue import admin; admin.retry_jobs(...)`).
"""

from __future__ import annotations

from sqla_queue.admin.jobs import (
    DEFAULT_DEPTH_CAP as DEFAULT_DEPTH_CAP,
)
from sqla_queue.admin.jobs import (
    MAX_LINKED as MAX_LINKED,
)
from sqla_queue.admin.jobs import (
    MAX_LIST_LIMIT as MAX_LIST_LIMIT,
)
from sqla_queue.admin.jobs import (
    MAX_WORKFLOW_JOBS as MAX_WORKFLOW_JOBS,
)
from sqla_queue.admin.jobs import (
    NOTIFY_PAYLOAD_CHARS as NOTIFY_PAYLOAD_CHARS,
)
from sqla_queue.admin.jobs import (
    RETRY_RACES as RETRY_RACES,
)
from sqla_queue.admin.jobs import (
    AttemptLog as AttemptLog,
)
from sqla_queue.admin.jobs import (
    JobDetail as JobDetail,
)
from sqla_queue.admin.jobs import (
    JobJournalView as JobJournalView,
)
from sqla_queue.admin.jobs import (
    JobLinks as JobLinks,
)
from sqla_queue.admin.jobs import (
    JobProgressReport as JobProgressReport,
)
from sqla_queue.admin.jobs import (
    JobStepInfo as JobStepInfo,
)
from sqla_queue.admin.jobs import (
    JobSummary as JobSummary,
)
from sqla_queue.admin.jobs import (
    LinkedJob as LinkedJob,
)
from sqla_queue.admin.jobs import (
    QueueDepth as QueueDepth,
)
from sqla_queue.admin.jobs import (
    QueueStats as QueueStats,
)
from sqla_queue.admin.jobs import (
    RetriedJobs as RetriedJobs,
)
from sqla_queue.admin.jobs import (
    SkippedRetry as SkippedRetry,
)
from sqla_queue.admin.jobs import (
    WorkflowJob as WorkflowJob,
)
from sqla_queue.admin.jobs import (
    WorkflowJobs as WorkflowJobs,
)
from sqla_queue.admin.jobs import (
    cancel_jobs as cancel_jobs,
)
from sqla_queue.admin.jobs import (
    cancel_workflow as cancel_workflow,
)
from sqla_queue.admin.jobs import (
    delete_jobs as delete_jobs,
)
from sqla_queue.admin.jobs import (
    get_job as get_job,
)
from sqla_queue.admin.jobs import (
    job_journal as job_journal,
)
from sqla_queue.admin.jobs import (
    job_links as job_links,
)
from sqla_queue.admin.jobs import (
    job_statuses as job_statuses,
)
from sqla_queue.admin.jobs import (
    job_steps as job_steps,
)
from sqla_queue.admin.jobs import (
    list_jobs as list_jobs,
)
from sqla_queue.admin.jobs import (
    prune as prune,
)
from sqla_queue.admin.jobs import (
    queue_depth as queue_depth,
)
from sqla_queue.admin.jobs import (
    retry_jobs as retry_jobs,
)
from sqla_queue.admin.jobs import (
    stats as stats,
)
from sqla_queue.admin.jobs import (
    workflow_jobs as workflow_jobs,
)
from sqla_queue.admin.partitions import (
    set_aging as set_aging,
)
from sqla_queue.admin.partitions import (
    set_fair as set_fair,
)
from sqla_queue.admin.partitions import (
    set_partition_limit as set_partition_limit,
)
from sqla_queue.admin.partitions import (
    set_partition_weight as set_partition_weight,
)
from sqla_queue.admin.partitions import (
    set_sequence_on_failure as set_sequence_on_failure,
)
from sqla_queue.admin.queues import (
    QueueInfo as QueueInfo,
)
from sqla_queue.admin.queues import (
    create_declared_queue as create_declared_queue,
)
from sqla_queue.admin.queues import (
    create_queue as create_queue,
)
from sqla_queue.admin.queues import (
    delete_queue as delete_queue,
)
from sqla_queue.admin.queues import (
    list_queues as list_queues,
)
from sqla_queue.admin.queues import (
    set_max_running as set_max_running,
)
from sqla_queue.admin.queues import (
    set_paused as set_paused,
)
from sqla_queue.admin.queues import (
    set_rate as set_rate,
)
from sqla_queue.admin.queues import (
    set_result_ttl as set_result_ttl,
)
from sqla_queue.admin.queues import (
    set_retention as set_retention,
)
from sqla_queue.admin.queues import (
    set_route as set_route,
)
from sqla_queue.admin.views import (
    job_in_full as job_in_full,
)
from sqla_queue.db.scaling import (
    QueueScaling as QueueScaling,
)
from sqla_queue.db.scaling import (
    scaling_signal as scaling_signal,
)
