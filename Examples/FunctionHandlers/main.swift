// Reproduces the function-based forms: a `void (*dispatch_function_t)(void *)` and a context pointer
// instead of a block, with `dispatch_set_context`, `dispatch_set_finalizer_f`, `dispatch_async_f`,
// `dispatch_apply_f`, `dispatch_source_set_event_handler_f` and `dispatch_source_set_cancel_handler_f`.
//
// On Linux: the same C functions, taking `@convention(c)` Swift functions (which, like C functions,
// capture nothing) and an `UnsafeMutableRawPointer?`. The toolchain's `Dispatch` module has none of the
// `_f` forms nor the context calls.

import GCD
import Glibc

/// What the functions share: malloc'ed, as in C.
struct MyContext {
  var name: UnsafeMutablePointer<CChar>
  var calls: Int
}

/// Signalled by the functions, so that the program can wait for them.
let called = try! Semaphore(value: 0)

func makeContext(_ name: String) -> UnsafeMutableRawPointer {
  let context = malloc(MemoryLayout<MyContext>.size)!.bindMemory(to: MyContext.self, capacity: 1)
  context.initialize(to: MyContext(name: strdup(name), calls: 0))
  return UnsafeMutableRawPointer(context)
}

/// For `dispatch_async_f` and `dispatch_source_set_event_handler_f`: counts its calls in the context.
func myCountingFunction(_ context: UnsafeMutableRawPointer?) {
  let data = context!.assumingMemoryBound(to: MyContext.self)
  data.pointee.calls += 1
  print("myCountingFunction: call \(data.pointee.calls) for '\(String(cString: data.pointee.name))'")
  called.signal()
}

/// For `dispatch_apply_f`: the index comes as the second argument.
func mySquareFunction(_ context: UnsafeMutableRawPointer?, _ index: Int) {
  context!.assumingMemoryBound(to: Int.self)[index] = index * index
}

/// For `dispatch_set_finalizer_f` and `dispatch_source_set_cancel_handler_f`: frees the context.
func myFreeFunction(_ context: UnsafeMutableRawPointer?) {
  let data = context!.assumingMemoryBound(to: MyContext.self)
  print("myFreeFunction: freeing '\(String(cString: data.pointee.name))' after \(data.pointee.calls) calls")
  free(data.pointee.name)
  free(data)
  called.signal()
}

func waitForCalls(_ count: Int) {
  for _ in 0..<count { precondition(called.wait(timeout: .seconds(10)), "a function was not called in 10 s") }
}

let squares = UnsafeMutablePointer<Int>.allocate(capacity: 8)
Queue.global().apply(8, context: squares, function: mySquareFunction)
print("dispatch_apply_f: squares \((0..<8).map { squares[$0] })")
squares.deallocate()

do {
  let queue = Queue(label: "com.example.FunctionQueue")
  queue.context = makeContext("the queue's context")
  queue.setFinalizer(myFreeFunction)
  for _ in 1...3 { queue.async(context: queue.context, function: myCountingFunction) }
  waitForCalls(3)

  let source = DataAddSource(queue: queue)
  source.setEventHandler(context: makeContext("the source's context"), function: myCountingFunction)
  source.setCancelHandler(context: source.context, function: myFreeFunction)
  source.resume()
  for value: UInt in 1...2 {
    source.merge(value)
    waitForCalls(1)
  }
  source.cancel()
  waitForCalls(1)
}
// The last references to the source and the queue are gone: the queue's finalizer frees its context.
waitForCalls(1)
