-- replay/gpu_names: the distinct names of one run's GPU work (kernels, copies, memsets), numbered
-- in name order, as the temporary table replay_names that replay/gpu_nodes.sql joins (the graph
-- carries a name's number, not 6.7 million copies of its text; pipeline/whatif/graph.py).
-- Parameter: getvariable('replay_run'), the run.
-- @column name VARCHAR: Kernel name or copy label (gpu_activities.name).
-- @column name_id INTEGER: Its position in name order, from 0.
CREATE OR REPLACE TEMP TABLE replay_names AS
SELECT name, (row_number() OVER (ORDER BY name) - 1)::INTEGER AS name_id
FROM (SELECT DISTINCT name FROM gpu_activities WHERE run_id = getvariable('replay_run') AND kind <> 'sync')
