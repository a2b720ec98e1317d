// The fidelity arms and the memory-vs-damage plot script (see fidelity_report.h).
#include "measure_report/fidelity_report.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <tuple>

namespace kvq {
namespace {

// A gnuplot double-quoted string: backslashes and quotes escaped, a newline as \n (a script line
// cannot hold a raw one).
std::string GnuplotString(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    if (ch == '\\' || ch == '"') out += '\\';
    out += ch;
  }
  return out + "\"";
}

// The last four characters, lower case (".png", ".svg").
std::string PlotExtension(const std::string& path) {
  std::string ext = path.size() >= 4 ? path.substr(path.size() - 4) : "";
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return ext;
}

}  // namespace

FidelityArm FidelityArm::Uniform(const KvSpec& spec) {
  return {.name = KvSpecName(spec), .layers = {LayerFormats::Both(spec)}};
}

Status CheckFidelityPlotPath(const std::string& output) {
  const std::string ext = PlotExtension(output);
  if (ext != ".png" && ext != ".svg") {
    return Status::Error(fmt::format("{}: the plot file must end in .png or .svg", output));
  }
  return Status::Ok();
}

Result<std::string> FidelityPlotScript(const FidelityReport& report, const FidelityPlotOptions& o) {
  if (Status s = CheckFidelityPlotPath(o.output); !s.ok()) return s;
  const std::string ext = PlotExtension(o.output);
  const bool kl = o.metric == FidelityPlotMetric::kKl;
  struct Point {
    double x, y;
    std::string name;
  };
  std::vector<Point> drawn;
  std::string not_drawn;
  for (const FidelityRow& r : report.formats) {
    const double y = kl ? r.kl : r.logit_drift;
    if (!(y > 0)) {  // log axis: 0 (f32, identical to the reference) has no place on it
      not_drawn += (not_drawn.empty() ? "" : ", ") + r.format;
      continue;
    }
    drawn.push_back({100.0 * r.memory_vs_f16, y, r.format});
  }
  if (drawn.empty()) {
    return Status::Error(fmt::format("{}: nothing to draw: every format's y value is 0 ({})", o.output, not_drawn));
  }
  // A label goes right of its point unless another point sits where it would be written (within
  // the label's width to the right — about 1.1% of the x range per character at 900 pixels — and
  // a quarter decade up or down); then it goes left.
  double max_x = 0;
  for (const Point& p : drawn) max_x = std::max(max_x, p.x);
  std::string right, left;
  for (const Point& p : drawn) {
    bool crowded = false;
    for (const Point& q : drawn) {
      const double width = 0.011 * max_x * static_cast<double>(p.name.size() + 2);
      crowded = crowded || (&q != &p && q.x >= p.x && q.x - p.x < width &&
                            std::abs(std::log10(q.y / p.y)) < 0.25);
    }
    (crowded ? left : right) += fmt::format("{:.6f} {:.9g} {}\n", p.x, p.y, GnuplotString(p.name));
  }
  std::string g;
  g += "# kvq eval fidelity: KV memory (x) against damage to the logits (y), one point per format.\n";
  if (ext == ".svg") {
    g += "set terminal svg size 900,600 noenhanced font \"sans,13\" background rgb \"white\"\n";
  } else {  // pngcairo draws smoother text; plain png (libgd) where this gnuplot lacks it
    g += "if (strstrt(GPVAL_TERMINALS, \" pngcairo \") > 0) {\n"
         "  set terminal pngcairo size 900,600 noenhanced font \"sans,11\" background rgb \"white\"\n"
         "} else {\n"
         "  set terminal png size 900,600 noenhanced background rgb \"white\"\n"
         "}\n";
  }
  g += "set output " + GnuplotString(o.output) + "\n";
  g += "set title " + GnuplotString(fmt::format("{}\nteacher-forced over {} positions against an f32 cache; "
                                                "lower is better", o.title, report.positions)) + "\n";
  g += "set xlabel \"KV cache memory, % of f16\"\n";
  g += kl ? "set ylabel \"mean KL(ref || cand) per position, nats (log scale)\"\n"
          : "set ylabel \"logit drift: mean |logit_cand - logit_ref| (log scale)\"\n";
  g += "set logscale y\nset format y \"%g\"\nset grid\nunset key\n";
  g += "set xrange [0:*]\nset offsets 0, graph 0.12, graph 0.08, graph 0.08\n";
  if (!not_drawn.empty()) {
    g += "set label 1 " + GnuplotString("0 (identical to the reference), not drawn on a log axis: " + not_drawn) +
         " at graph 0.02, graph 0.04 left\n";
  }
  g += "$right << EOD\n" + right + "EOD\n";
  g += "$left << EOD\n" + left + "EOD\n";
  // An empty datablock is a gnuplot error, so only the non-empty ones are plotted.
  std::string plot = "plot ";
  for (const auto& [name, rows, align, dx] : {std::tuple{"$right", &right, "left", "0.9"},
                                              std::tuple{"$left", &left, "right", "-0.9"}}) {
    if (rows->empty()) continue;
    if (plot != "plot ") plot += ", \\\n     ";
    plot += fmt::format("{0} using 1:2 with points pointtype 7 pointsize 1.4 linecolor rgb \"#1f5fa8\", \\\n"
                        "     {0} using 1:2:3 with labels {1} offset character {2}, character 0.45",
                        name, align, dx);
  }
  g += plot + "\n";
  g += "set output\n";
  return g;
}

}  // namespace kvq
