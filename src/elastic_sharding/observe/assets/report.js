(function(){
var root=document.documentElement;
var data=JSON.parse(document.getElementById('job-data').textContent);
function key(cell){var v=cell.getAttribute('data-sort');if(v===null)v=cell.textContent.trim();
if(v===''||v==='\u2013')return [2,''];return /^-?\d+(\.\d+)?(e[-+]?\d+)?$/i.test(v)?[0,parseFloat(v)]:[1,v.toLowerCase()];}
function sortBy(th){var table=th.closest('table'),col=th.cellIndex,body=table.tBodies[0];
var dir=th.getAttribute('aria-sort')==='ascending'?-1:1;
table.querySelectorAll('th').forEach(function(h){h.removeAttribute('aria-sort');});
th.setAttribute('aria-sort',dir>0?'ascending':'descending');
Array.from(body.rows).map(function(r,i){return [key(r.cells[col]),i,r];}).sort(function(a,b){
var x=a[0],y=b[0];if(x[0]!==y[0])return x[0]-y[0];if(x[1]<y[1])return -dir;if(x[1]>y[1])return dir;return a[1]-b[1];
}).forEach(function(e){body.appendChild(e[2]);});}
document.querySelectorAll('table.sortable th').forEach(function(th){th.addEventListener('click',function(){sortBy(th);});});
var svg=document.querySelector('svg.timeline'),marked=document.querySelectorAll('[data-shard]');
function mark(shard){marked.forEach(function(el){el.classList.toggle('hl',shard!==null&&el.getAttribute('data-shard')===shard);});
if(svg)svg.classList.toggle('focus',shard!==null);}
marked.forEach(function(el){el.addEventListener('mouseenter',function(){mark(el.getAttribute('data-shard'));});
el.addEventListener('mouseleave',function(){mark(null);});});
var bars=document.querySelectorAll('rect.attempt').length;
if(bars!==data.attempts.length)throw new Error('timeline has '+bars+' bars for '+data.attempts.length+' attempts');
root.dataset.rendered='ok';
})();
