// Reproduces the main dispatch queue passage ("Performing Tasks on the Main Thread"): a globally
// available serial queue, `dispatch_get_main_queue()`, whose blocks run on the application's main
// thread once the application drains it.
//
// On Linux there is no run loop: the program drains the main queue with `Queue.dispatchMain()` (this
// library's, which runs the blocks on the main thread itself, where libdispatch's `dispatch_main` would
// use its worker threads) and ends with `exit(0)` from a main-queue block.

import GCD
import Glibc
import Synchronization

let producers = 3
let blocksEach = 4
let ran = Atomic<Int>(0)
let group = Group()
let submitted = Group()

// Producers on queues of their own submit blocks to the main queue: none runs before it is drained.
for number in 1...producers {
  let producer = Queue(label: "com.example.Producer\(number)")
  submitted.async(on: producer) {
    for block in 1...blocksEach {
      group.enter()
      Queue.main.async {
        ran.add(1, ordering: .relaxed)
        let thread = Queue.isMainThread ? "the main thread" : "another thread"
        print("\(producer.label) block \(block) runs on \(thread)")
        group.leave()
      }
    }
  }
}
submitted.wait()
print("blocks run before the main queue is drained: \(ran.load(ordering: .relaxed)) of \(producers * blocksEach)")

group.notify(on: .main) {
  print("all \(ran.load(ordering: .relaxed)) blocks ran; exit(0) from a main-queue block")
  exit(0)
}
print("the main thread calls Queue.dispatchMain()")
Queue.dispatchMain()
