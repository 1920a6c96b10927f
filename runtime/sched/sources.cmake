# Sources of runtime/sched/ (page pool, prefix index, scheduler).
list(APPEND TSR_CORE_SOURCES
  runtime/sched/pages.c
  runtime/sched/prefix.c
  runtime/sched/scheduler.c
  runtime/sched/sched_plan.c
  runtime/sched/sched_check.c
)
