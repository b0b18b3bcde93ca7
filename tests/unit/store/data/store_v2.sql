-- A v2 store written by otel-gpu's StoreExporter at schema v2 (git e0c6148), dumped with
-- sqlite3 iterdump(): one request (/old, 1 launch, 2048 B h2d, 0.5 GPU s) and one outside window (0.2 s).
PRAGMA user_version = 2;
BEGIN TRANSACTION;
CREATE TABLE requests (
    ts INTEGER NOT NULL,             -- server span start, epoch ns
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    service TEXT NOT NULL,
    k8s_namespace TEXT,
    k8s_pod TEXT,
    method TEXT,
    route TEXT,
    feature TEXT NOT NULL,
    status_code INTEGER,
    duration_ns INTEGER NOT NULL,
    launches INTEGER NOT NULL,
    h2d_bytes INTEGER NOT NULL,
    d2h_bytes INTEGER NOT NULL,
    d2d_bytes INTEGER NOT NULL,
    other_bytes INTEGER NOT NULL,
    sync_ns INTEGER NOT NULL,
    gpu_seconds REAL NOT NULL,
    cost REAL NOT NULL,
    currency TEXT,
    ambiguous REAL NOT NULL          -- otel_gpu.calls.ambiguous: share of ambiguous calls
);
INSERT INTO "requests" VALUES(1700000000000000000,'00000000000000000000000000000001','00000000000003e9','demo',NULL,NULL,'POST','/old','/old',200,2000000,1,2048,0,0,0,7,0.5,0.1,'USD',0.0);
CREATE TABLE spans (
    trace_id TEXT NOT NULL,          -- 32 lowercase hex digits
    span_id TEXT NOT NULL,           -- 16 lowercase hex digits
    parent_span_id TEXT,
    group_ts INTEGER NOT NULL,
    name TEXT NOT NULL,
    kind INTEGER NOT NULL,           -- opentelemetry.trace.SpanKind value
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    status_code INTEGER NOT NULL,    -- opentelemetry.trace.StatusCode value
    status_message TEXT,
    attributes TEXT NOT NULL,        -- JSON object
    service TEXT,
    pid INTEGER,
    PRIMARY KEY (trace_id, span_id)
);
INSERT INTO "spans" VALUES('00000000000000000000000000000001','00000000000003e9','0000000000000063',1700000000000000000,'POST /old',1,1700000000000000000,1700000000002000000,0,NULL,'{"http.request.method":"POST","http.route":"/old","url.path":"/old","http.response.status_code":200,"process.pid":4242,"gpu.calls":2,"gpu.launches":1,"gpu.memcpy.h2d.bytes":2048,"gpu.memcpy.d2h.bytes":0,"gpu.memcpy.d2d.bytes":0,"gpu.memcpy.other.bytes":0,"gpu.sync.duration_ns":7,"otel_gpu.calls.ambiguous":0,"otel_gpu.cost.gpu_seconds":0.5,"otel_gpu.cost.amount":0.1,"otel_gpu.cost.currency":"USD"}','demo',4242);
INSERT INTO "spans" VALUES('00000000000000000000000000000001','00000000000003ea','00000000000003e9',1700000000000000000,'cudaLaunchKernel',0,1700000000000000010,1700000000000000060,0,NULL,'{"gpu.cuda.call":"cudaLaunchKernel","gpu.kernel.name":"vector_add(float const*, float*, int)","gpu.grid":[4,1,1],"gpu.block":[256,1,1],"gpu.timing":"host_enqueue"}','demo',4242);
INSERT INTO "spans" VALUES('00000000000000000000000000000001','00000000000003eb','00000000000003e9',1700000000000000000,'cudaMemcpy',0,1700000000000000110,1700000000000000160,0,NULL,'{"gpu.cuda.call":"cudaMemcpy","gpu.memcpy.bytes":2048,"gpu.memcpy.direction":"h2d","gpu.timing":"host_enqueue"}','demo',4242);
INSERT INTO "spans" VALUES('00000000000000000000000000000002','00000000000007d1',NULL,1700000000000000001,'GPU work outside requests',0,1700000000000000001,1700000000001000001,0,NULL,'{"otel_gpu.attribution":"outside","gpu.launches":1,"otel_gpu.cost.gpu_seconds":0.2,"otel_gpu.cost.amount":0.04,"otel_gpu.cost.currency":"USD"}','demo',4242);
INSERT INTO "spans" VALUES('00000000000000000000000000000002','00000000000007d2','00000000000007d1',1700000000000000001,'cudaLaunchKernel',0,1700000000000000001,1700000000000000006,0,NULL,'{"gpu.kernel.name":"outside_kernel(int)"}','demo',4242);
CREATE TABLE window_costs (
    ts INTEGER NOT NULL,             -- window span start, epoch ns
    trace_id TEXT NOT NULL,          -- the window span
    span_id TEXT NOT NULL,
    service TEXT NOT NULL,
    pid INTEGER,
    kind TEXT NOT NULL,              -- 'split' or 'outside'
    feature TEXT,
    request_trace_id TEXT,           -- the candidate request (split rows)
    request_span_id TEXT,
    gpu_seconds REAL NOT NULL,
    cost REAL NOT NULL,
    currency TEXT
);
INSERT INTO "window_costs" VALUES(1700000000000000001,'00000000000000000000000000000002','00000000000007d1','demo',4242,'outside',NULL,NULL,NULL,0.2,0.04,'USD');
CREATE INDEX spans_group_ts ON spans (group_ts);
CREATE INDEX requests_ts ON requests (ts);
CREATE INDEX requests_latency ON requests (service, feature, duration_ns, ts);
CREATE INDEX window_costs_ts ON window_costs (ts);
COMMIT;
