// Reproduces the function-based forms: a `void (*dispatch_function_t)(void *)` plus a context pointer
// instead of a block, through `dispatch_async_f`, `dispatch_sync_f`, `dispatch_group_async_f`,
// `dispatch_group_notify_f`, `dispatch_apply_f`, `dispatch_after_f`, `dispatch_set_context` and
// `dispatch_set_finalizer_f`.
//
// On Linux: the same C functions, taking `@convention(c)` Swift functions (which capture nothing, like
// C functions) and an `UnsafeMutableRawPointer?` context. The toolchain's `Dispatch` module has none of
// the `_f` forms nor the context calls. The source handlers' `_f` forms come with the source types.

import GCD
import Glibc
import Synchronization

/// The context the functions share, malloc'ed as in C.
struct WorkContext {
  var name: UnsafeMutablePointer<CChar>
  var count: Int
  /// One slot per index, written by `dispatch_apply_f` and by the group's functions.
  var squares: UnsafeMutablePointer<Int>
  var cubes: UnsafeMutablePointer<Int>
  /// Touched only on the serial queue, so it needs no lock.
  var asyncRuns: Int
}

/// What a group task gets: the shared context and its own index.
struct CubeTask {
  var work: UnsafeMutablePointer<WorkContext>
  var index: Int
}

/// Signalled by the functions that end a step, so the program can wait for them.
let stepDone = try! Semaphore(value: 0)
let finalizerRuns = Atomic<Int>(0)
let notifiedSum = Atomic<Int>(-1)

func context(_ raw: UnsafeMutableRawPointer?) -> UnsafeMutablePointer<WorkContext> {
  raw!.assumingMemoryBound(to: WorkContext.self)
}

// MARK: - Queues and groups

/// For `dispatch_async_f`.
func myAsyncFunction(_ raw: UnsafeMutableRawPointer?) {
  let work = context(raw)
  work.pointee.asyncRuns += 1
  print("dispatch_async_f: myAsyncFunction ran for '\(String(cString: work.pointee.name))'")
}

/// For `dispatch_sync_f`: runs after the async function, on the same serial queue.
func mySyncFunction(_ raw: UnsafeMutableRawPointer?) {
  print("dispatch_sync_f: mySyncFunction sees \(context(raw).pointee.asyncRuns) async run(s) before it")
}

/// For `dispatch_apply_f`: the index comes as the second argument.
func mySquareFunction(_ raw: UnsafeMutableRawPointer?, _ index: Int) {
  context(raw).pointee.squares[index] = index * index
}

/// For `dispatch_group_async_f`: each task has a small context of its own, freed by the task.
func myCubeFunction(_ raw: UnsafeMutableRawPointer?) {
  let task = raw!.assumingMemoryBound(to: CubeTask.self)
  task.pointee.work.pointee.cubes[task.pointee.index] = task.pointee.index * task.pointee.index * task.pointee.index
  free(task)
}

/// For `dispatch_group_notify_f`: runs once every cube is done.
func myNotifyFunction(_ raw: UnsafeMutableRawPointer?) {
  let work = context(raw)
  let sum = (0..<work.pointee.count).reduce(0) { $0 + work.pointee.cubes[$1] }
  print("dispatch_group_notify_f: myNotifyFunction sums the cubes: \(sum)")
  notifiedSum.store(sum, ordering: .relaxed)
  stepDone.signal()
}

/// For `dispatch_after_f`.
func myLaterFunction(_ raw: UnsafeMutableRawPointer?) {
  print("dispatch_after_f: myLaterFunction ran for '\(String(cString: context(raw).pointee.name))'")
  stepDone.signal()
}

/// For `dispatch_set_finalizer_f`: frees the context once the queue is gone.
func myFinalizerFunction(_ raw: UnsafeMutableRawPointer?) {
  let work = context(raw)
  print("dispatch_set_finalizer_f: myFinalizerFunction frees '\(String(cString: work.pointee.name))'")
  free(work.pointee.name)
  free(work.pointee.squares)
  free(work.pointee.cubes)
  free(work)
  finalizerRuns.add(1, ordering: .relaxed)
  stepDone.signal()
}

func wait(for step: String) {
  if !stepDone.wait(timeout: .seconds(10)) {
    print("\(step) did not run within 10 s")
    exit(1)
  }
}

func queueAndGroupFunctions() {
  print("-- queues and groups")
  let count = 10
  let work = malloc(MemoryLayout<WorkContext>.size)!.bindMemory(to: WorkContext.self, capacity: 1)
  work.initialize(
    to: WorkContext(
      name: strdup("com.example.FunctionQueue context"), count: count,
      squares: malloc(count * MemoryLayout<Int>.size)!.bindMemory(to: Int.self, capacity: count),
      cubes: malloc(count * MemoryLayout<Int>.size)!.bindMemory(to: Int.self, capacity: count), asyncRuns: 0))

  var queue: Queue? = Queue(label: "com.example.FunctionQueue")
  // dispatch_set_context and dispatch_set_finalizer_f: the queue carries the context and frees it last.
  queue!.context = UnsafeMutableRawPointer(work)
  queue!.setFinalizer(myFinalizerFunction)

  queue!.async(context: queue!.context, function: myAsyncFunction)
  queue!.sync(context: queue!.context, function: mySyncFunction)

  Queue.global().apply(count, context: UnsafeMutableRawPointer(work), function: mySquareFunction)
  let squares = (0..<count).map { work.pointee.squares[$0] }
  print("dispatch_apply_f: squares \(squares)")
  print("apply_f filled every slot: \(squares == (0..<count).map { $0 * $0 })")

  let group = Group()
  for index in 0..<count {
    let task = malloc(MemoryLayout<CubeTask>.size)!.bindMemory(to: CubeTask.self, capacity: 1)
    task.initialize(to: CubeTask(work: work, index: index))
    group.async(on: Queue.global(), context: UnsafeMutableRawPointer(task), function: myCubeFunction)
  }
  group.notify(on: queue!, context: UnsafeMutableRawPointer(work), function: myNotifyFunction)
  wait(for: "myNotifyFunction")
  let expected = (0..<count).reduce(0) { $0 + $1 * $1 * $1 }
  print("notify_f ran after every group_async_f task: \(notifiedSum.load(ordering: .relaxed) == expected)")

  queue!.after(deadline: .now + .milliseconds(20), context: UnsafeMutableRawPointer(work), function: myLaterFunction)
  wait(for: "myLaterFunction")

  // The last reference goes: libdispatch calls the finalizer with the context.
  queue = nil
  wait(for: "myFinalizerFunction")
  print("finalizer ran once: \(finalizerRuns.load(ordering: .relaxed) == 1)")
}

queueAndGroupFunctions()
