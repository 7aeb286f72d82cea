-- exposure_cover: per rank, the compute intervals collective_exposure.sql measures each
-- communication kernel against (it takes their union): the rank's compute kernels in scope. When
-- the connection reads per-source results (pipeline/query.py use_local), connect() replaces this
-- view by the rank-level pieces of local_comm_cover (the union of compute ∩ the union of
-- communication, stored at ingest, far fewer rows): every communication kernel lies inside the
-- communication union, so its overlap with the compute union is the same either way.
-- Columns: run_id, rank, start_ns, end_ns (end_ns >= start_ns).
-- @internal exposure_cover: collective_exposure.sql's compute pieces (replaced by stored results).
CREATE OR REPLACE VIEW exposure_cover AS
SELECT run_id, rank, start_ns, greatest(end_ns, start_ns) AS end_ns FROM scope WHERE category = 'compute';
