//! Allocating a memory region: from remem's pool of pre-registered memory
//! (`alloc_local_mr`) against registering each allocation (`alloc_local_mr_with`, what a
//! design without a pool pays on every allocation), on a soft device.
//!
//! Also the cost of copying into and out of registered memory.
//!
//! `cargo bench -p remem --bench alloc`

#![allow(missing_docs)] // criterion_group! and criterion_main! generate undocumented items

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use remem::{AccessFlags, RdmaBuilder};
use std::alloc::Layout;
use std::hint::black_box;

fn alloc(c: &mut Criterion) {
    let rdma = RdmaBuilder::new()
        .device("soft@127.0.0.1:0")
        .build()
        .expect("a soft device on 127.0.0.1");
    let mut group = c.benchmark_group("alloc_local_mr");
    for size in [4096usize, 65536] {
        let layout = Layout::from_size_align(size, 8).unwrap();
        group.bench_with_input(BenchmarkId::new("pool", size), &layout, |b, l| {
            b.iter(|| black_box(rdma.alloc_local_mr(*l).unwrap()))
        });
        group.bench_with_input(BenchmarkId::new("pool_uninit", size), &layout, |b, l| {
            b.iter(|| black_box(rdma.alloc_local_mr_uninit(*l).unwrap()))
        });
        group.bench_with_input(BenchmarkId::new("register_each", size), &layout, |b, l| {
            b.iter(|| {
                black_box(
                    rdma.alloc_local_mr_with(*l, AccessFlags::LOCAL_WRITE)
                        .unwrap(),
                )
            })
        });
    }
    group.finish();
}

/// Copying into and out of registered memory (every copy goes through word-sized atomic
/// accesses, see `LocalMr`).
fn copy(c: &mut Criterion) {
    let rdma = RdmaBuilder::new()
        .device("soft@127.0.0.1:0")
        .build()
        .expect("a soft device on 127.0.0.1");
    let size = 65536;
    let mr = rdma
        .alloc_local_mr(Layout::from_size_align(size, 8).unwrap())
        .unwrap();
    let data = vec![7u8; size];
    let mut group = c.benchmark_group("local_mr_copy");
    group.throughput(criterion::Throughput::Bytes(size as u64));
    group.bench_function("write_64KiB", |b| {
        b.iter(|| mr.write(0, black_box(&data)).unwrap())
    });
    group.bench_function("to_vec_64KiB", |b| b.iter(|| black_box(mr.to_vec())));
    group.finish();
}

criterion_group!(benches, alloc, copy);
criterion_main!(benches);
