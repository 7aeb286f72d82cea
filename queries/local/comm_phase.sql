-- local_comm_phase: run at ingest on one source alone (pipeline/local.py): each communication
-- kernel of the source with the phase that launched it (views/70_phases.sql phase_parts; on one
-- source alone no kernel is split into waiting and transfer, so each is one row).
--
-- Why: analysis splits each phase's exposed communication into waiting for peers and transfer
-- with the other ranks' kernels (queries/local/phases.sql). Reading the phase of each collective
-- from here, it never re-assigns phases to the GPU work (the host ranges of every cpu_ops row).
-- Columns:
--   run_id STRING; rank INT32; correlation INT64; start_ns, end_ns INT64 ns (the kernel)
--   phase STRING: forward, backward, optimizer, other, NULL (as phase_parts)
SELECT run_id, rank, correlation, start_ns, end_ns, phase
FROM phase_parts WHERE category = 'communication'
ORDER BY run_id, rank, start_ns, correlation;
